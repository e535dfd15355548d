"""JSON Lines bytes to records, and records to float64 columns: the one decoding path shared by
the reader, the tail, the catalog and the writer's sidecar.

Every line is parsed on its own (a block parse that joins lines with commas would accept two
half-lines as one record): orjson first, about ten times faster than the stdlib
(benchmarks/NOTES.md, "Reading runs"); it rejects the ``NaN`` / ``Infinity`` tokens the format
allows, so such a line goes to the stdlib, which reads them exactly. The reading contract's
checks live here: UTF-8, nesting at most MAX_DEPTH, one object per line, the fields a reader
relies on typed (``CHECKS``); a line that fails is reported with its number and what is wrong,
and the others are read. Without orjson installed everything still works, only slower.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from nbmonitor.runs.format import MAX_DEPTH, RunDataWarning

try:
    import orjson

    _fast_loads: Callable[[bytes], Any] | None = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency; the fallback keeps reading
    _fast_loads = None

FloatArray = npt.NDArray[np.float64]
Record = dict[str, Any]


def split_complete(data: bytes) -> tuple[bytes, bytes]:
    """``data`` cut after its last newline: (whole lines, torn rest still being written)."""
    end = data.rfind(b"\n") + 1
    return data[:end], data[end:]


class BadLine(NamedTuple):
    line: int  # 1-based line number in the file
    why: str  # what is wrong, in a few words


def loads_line(line: bytes) -> object:
    """One JSON Lines line parsed on its own, with the reading contract's checks: valid UTF-8,
    one JSON value, nested at most MAX_DEPTH deep. ValueError saying what is wrong else (never
    RecursionError or UnicodeDecodeError)."""
    value: object = None
    done = False
    # orjson (3.8) recurses on the C stack without a limit: a line nested a few hundred
    # thousand deep crashes the process. Such lines go to the stdlib, which raises instead.
    if _fast_loads is not None and not _nests(line):
        # NaN / Infinity, an integer too big for orjson, or not JSON: the stdlib says which.
        with contextlib.suppress(ValueError):
            value, done = _fast_loads(line), True
    if not done:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 (byte {exc.start + 1})") from None
        try:
            value = json.loads(text, parse_int=_bounded_int)
        except RecursionError:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
        except ValueError as exc:
            raise ValueError(f"not JSON ({str(exc).split(':')[0]})") from None
    if _nests(line) and _depth(value) > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    return value


def _bounded_int(text: str) -> int | float:
    """A JSON integer, or NaN past what a float64 holds: such a number is no count, id or
    size, and any sum or ratio with it would raise OverflowError deep inside a reader
    (``"total_steps": 1e400`` written as digits). Python's own limit on an integer's digits
    still makes a longer one a line that is not JSON."""
    value = int(text)
    if len(text) > 300:
        try:
            float(value)
        except OverflowError:
            return math.nan
    return value


def _depth(value: object) -> int:
    """How deep ``value`` nests (iteratively: no recursion to exhaust)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return deepest


def _finite_int(value: object) -> bool:
    if type(value) is int:
        return -(2**53) <= value <= 2**53
    return (
        type(value) is float and math.isfinite(value) and value.is_integer() and abs(value) <= 2**53
    )


def _number_or_none(value: object) -> bool:
    return value is None or (type(value) in (int, float) and _finite_float(value))


def _finite_float(value: object) -> bool:
    try:
        return math.isfinite(float(value))  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return False


# Fields a reader relies on, per stream: the check a record must pass to be returned (one that
# fails is skipped with a warning). Metrics beyond these are typed by to_columns (NaN if not a
# number) or left as they are (free-form event fields).
def _check_columns(r: Record) -> str | None:
    step = r.get("step")
    if step is not None and not _finite_int(step):
        return f"step {_short(step)} is not a finite integer"
    return None


def _check_events(r: Record) -> str | None:
    if not _number_or_none(r.get("time")):
        return f"time {_short(r.get('time'))} is not a finite number"
    step = r.get("step")
    if step is not None and not _finite_int(step):
        return f"step {_short(step)} is not a finite integer"
    for key in ("rule", "severity", "message", "subject", "kind", "cause", "place", "fix"):
        if key in r and not isinstance(r[key], (str, type(None))):
            return f"{key} is not a string"
    layers = r.get("layers")
    if layers is not None and not (
        isinstance(layers, list) and all(isinstance(x, str) for x in layers)
    ):
        return "layers is not a list of names"
    if not isinstance(r.get("evidence"), (dict, type(None))):
        return "evidence is not an object"
    if not isinstance(r.get("explains"), (list, type(None))):
        return "explains is not a list"
    return None


def _check_spans(r: Record) -> str | None:
    if not isinstance(r.get("name"), str):
        return "name is not a string"
    for key in ("start", "dur"):
        if not (type(r.get(key)) in (int, float) and _finite_float(r.get(key))):
            return f"{key} {_short(r.get(key))} is not a finite number"
    for key in ("step", "depth", "thread"):
        if r.get(key) is not None and not _finite_int(r.get(key)):
            return f"{key} {_short(r.get(key))} is not a finite integer"
    return None


CHECKS: dict[str, Callable[[Record], str | None]] = {
    "steps": _check_columns,
    "system": _check_columns,
    "layers": _check_columns,
    "events": _check_events,
    "spans": _check_spans,
    "memory": _check_columns,
}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Decoded(NamedTuple):
    records: list[Record]  # objects only: blank lines are skipped
    bad: list[BadLine]  # lines skipped, and why
    lines: int  # lines seen (blank ones included: line numbers count them)


def decode_lines(
    data: bytes, *, first_line: int = 1, check: Callable[[Record], str | None] | None = None
) -> Decoded:
    """Records of whole JSON Lines ``data`` (ending in a newline, or empty), each line parsed
    on its own (:func:`loads_line`); ``first_line`` is the number of the first line of
    ``data`` in its file. A line that is not a JSON object, or fails ``check``, is reported in
    ``bad`` (with its line number and what is wrong), not raised: one bad line never costs the
    others.
    """
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    records: list[Record] = []
    bad: list[BadLine] = []
    fast = _fast_loads
    # A block with few brackets in all cannot hold a line nested deeper than MAX_DEPTH: its
    # lines skip the per-line count.
    deep = data.count(b"{") + data.count(b"[") > MAX_DEPTH
    for i, line in enumerate(lines):
        value: object = None
        risky = deep and _nests(line)
        if fast is not None and not risky:
            try:
                value = fast(line)
            except ValueError:
                value = None
        if value is None or risky:
            if not line.strip():
                continue
            try:
                value = loads_line(line)
            except ValueError as exc:
                bad.append(BadLine(first_line + i, str(exc)))
                continue
        if type(value) is not dict:
            bad.append(BadLine(first_line + i, f"a JSON {_kind(value)}, not an object"))
            continue
        if check is not None:
            why = check(value)
            if why is not None:
                bad.append(BadLine(first_line + i, why))
                continue
        records.append(value)
    return Decoded(records, bad, len(lines))


def _nests(line: bytes) -> bool:
    return line.count(b"[") + line.count(b"{") > MAX_DEPTH


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else "value"


class LineSplitter:
    """Bytes of a stream, fed in pieces, cut into whole lines with the line bound applied: a
    line longer than ``max_line`` is never held whole (its bytes are dropped as they arrive, up
    to its newline) and is reported as a bad line; a torn last line waits in ``rest``.

    ``offset`` is the byte offset (from where feeding started) up to which everything was dealt
    with (whole lines returned, long lines skipped); ``line`` the number of the next line.
    """

    __slots__ = ("line", "max_line", "offset", "rest", "skipping")

    def __init__(self, max_line: int, line: int = 1, offset: int = 0) -> None:
        self.max_line = max_line
        self.line = line
        self.offset = offset
        self.rest = b""
        self.skipping = False

    def feed(self, data: bytes) -> tuple[bytes, int, list[BadLine]]:
        """(whole lines of ``data`` after what was held back, the number of their first line,
        lines skipped as too long). Long lines inside the returned bytes are blanked (an empty
        line keeps the numbering), so the caller's decoder never sees them."""
        bad: list[BadLine] = []
        if self.skipping:
            nl = data.find(b"\n")
            if nl < 0:
                self.offset += len(data)
                return b"", self.line, bad
            self.offset += nl + 1
            data = data[nl + 1 :]
            self.skipping = False
            self.line += 1
        buf = self.rest + data if self.rest else data
        end = buf.rfind(b"\n") + 1
        whole, rest = buf[:end], buf[end:]
        first = self.line
        if len(whole) > self.max_line:
            lines = whole.split(b"\n")
            if any(len(ln) > self.max_line for ln in lines):
                for i, ln in enumerate(lines):
                    if len(ln) > self.max_line:
                        bad.append(BadLine(first + i, f"longer than {self.max_line} bytes"))
                        lines[i] = b""
                kept = b"\n".join(lines)
                self.offset += len(whole) - len(kept)
                whole = kept
        self.offset += len(whole)
        self.line += whole.count(b"\n")
        if len(rest) > self.max_line:
            bad.append(BadLine(self.line, f"longer than {self.max_line} bytes"))
            self.offset += len(rest)
            self.rest = b""
            self.skipping = True
        else:
            self.rest = rest
        return whole, first, bad


# At most this many skipped lines are named per file and read; the rest are counted.
WARN_LINES = 5


Report = Callable[[str], None]


def warn_bad(
    path: object, bad: list[BadLine], extra: str = "", report: Report | None = None
) -> None:
    """One message per skipped line (the first WARN_LINES), then one with the count: each
    given to ``report``, or (without one) raised as a RunDataWarning."""
    messages = [f"nbmonitor: {path} line {b.line}: {b.why}; skipped{extra}." for b in bad]
    if len(bad) > WARN_LINES:
        messages[WARN_LINES:] = [
            f"nbmonitor: {path}: {len(bad) - WARN_LINES} more bad lines skipped."
        ]
    for message in messages:
        if report is not None:
            report(message)
        else:
            warnings.warn(RunDataWarning(message), stacklevel=3)


def _number(value: object) -> float:
    if isinstance(value, (int, float, np.integer, np.floating)):
        try:
            return float(value)
        except OverflowError:  # an integer beyond float64: not a number we can hold
            return math.nan
    return math.nan


_NUMERIC = frozenset((float, int, bool))
IntArray = npt.NDArray[np.int64]
Sparse = tuple[IntArray, FloatArray]  # (row indices, increasing; values)


def _floats(values: list[Any]) -> FloatArray:
    """``values`` as float64: numbers as they are, anything else (a string, null, a list, an
    integer past float64's range) NaN. Strings are never parsed as numbers."""
    col = None
    if set(map(type, values)) <= _NUMERIC:
        with contextlib.suppress(OverflowError):  # an integer past float64: the slow path
            col = np.array(values, dtype=np.float64)
    if col is None:
        col = np.array([_number(v) for v in values], dtype=np.float64)
    # One NaN: a NaN with a payload (or a sign) is written "NaN" and reads back as the plain
    # one, so the sidecar holds that one too and both read back bit for bit alike.
    nan = np.isnan(col)
    if nan.any():
        col[nan] = np.nan
    return col


class Columns(Mapping[str, FloatArray]):
    """A stream's records as float64 columns of ``rows`` values each: keys in first-seen
    order, NaN where a record lacks the key.

    A key present in fewer than half the rows is held sparse (its row indices and values) and
    made a full column only when it is looked up, so that keys logged once or rarely cost
    memory in proportion to their values, not rows x keys. ``dict(columns)`` makes every
    column full.
    """

    __slots__ = ("dense", "order", "rows", "sparse")

    def __init__(
        self,
        rows: int,
        dense: dict[str, FloatArray] | None = None,
        sparse: dict[str, Sparse] | None = None,
        order: list[str] | None = None,
    ) -> None:
        self.rows = rows
        self.dense = dense if dense is not None else {}
        self.sparse = sparse if sparse is not None else {}
        self.order = order if order is not None else [*self.dense, *self.sparse]

    def __getitem__(self, key: str) -> FloatArray:
        col = self.dense.get(key)
        if col is not None:
            return col
        idx, values = self.sparse[key]
        full = np.full(self.rows, np.nan)
        full[idx] = values
        return full

    def __contains__(self, key: object) -> bool:
        return key in self.dense or key in self.sparse

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)

    def present(self, key: str) -> Sparse:
        """The rows where ``key`` has a value that is not NaN, and those values."""
        if key in self.sparse:
            idx, values = self.sparse[key]
        else:
            col = self.dense[key]
            idx = np.flatnonzero(~np.isnan(col))
            values = col[idx]
        keep = ~np.isnan(values)
        return idx[keep], values[keep]

    @property
    def nbytes(self) -> int:
        """Bytes the columns hold now (sparse keys at their own size)."""
        dense = sum(c.nbytes for c in self.dense.values())
        return dense + sum(i.nbytes + v.nbytes for i, v in self.sparse.values())

    def __repr__(self) -> str:
        return f"Columns(rows={self.rows}, keys={self.order[:8]}{'...' if len(self) > 8 else ''})"


def _sparse_enough(count: int, rows: int) -> bool:
    return 2 * count < rows


def _same_keys(records: Sequence[Mapping[str, object]]) -> bool:
    keys = records[0].keys()
    n = len(keys)
    return all(len(r) == n and r.keys() == keys for r in records)


def to_columns(records: Sequence[Mapping[str, object]]) -> Columns:
    """Records as float64 columns: union of keys in first-seen order, NaN where missing.

    Values that are not numbers (JSON null, a list, a string) read as NaN: one odd value never
    costs the rest of the column. One pass over the values (keys logged rarely cost what their
    values cost). The writer's sidecar goes through here too, so the sidecar and the JSON
    Lines read back alike.
    """
    rows = len(records)
    if rows and _same_keys(records):
        # Every record has the same keys (the common case: one step's metrics): a column per
        # key in one comprehension each.
        first = list(records[0])
        return Columns(rows, {k: _floats([r[k] for r in records]) for k in first}, {}, first)
    where: dict[str, list[int]] = {}
    values: dict[str, list[Any]] = {}
    for i, r in enumerate(records):
        for k, v in r.items():
            vs = values.get(k)
            if vs is None:
                where[k], values[k] = [i], [v]
            else:
                where[k].append(i)
                vs.append(v)
    dense: dict[str, FloatArray] = {}
    sparse: dict[str, Sparse] = {}
    for k, vs in values.items():
        col = _floats(vs)
        if len(vs) == rows:
            dense[k] = col
        elif _sparse_enough(len(vs), rows):
            sparse[k] = (np.array(where[k], dtype=np.int64), col)
        else:
            full = np.full(rows, np.nan)
            full[where[k]] = col
            dense[k] = full
    return Columns(rows, dense, sparse, list(values))


def concat_columns(blocks: Iterable[Columns]) -> Columns:
    """Blocks of columns as one: keys in first-seen order, NaN filling the rows of blocks that
    lack a key; a key stays sparse while it is in fewer than half the rows."""
    blocks = [b for b in blocks if b.rows or len(b)]
    if not blocks:
        return Columns(0)
    if len(blocks) == 1:
        b = blocks[0]
        if all(c.flags.writeable for c in b.dense.values()):
            return b
        # A chunk's arrays are views of the bytes read: the caller gets arrays of its own.
        own = {k: c.copy() for k, c in b.dense.items()}
        own_sparse = {k: (i.copy(), v.copy()) for k, (i, v) in b.sparse.items()}
        return Columns(b.rows, own, own_sparse, list(b.order))
    order: dict[str, None] = {}
    for b in blocks:
        order.update(dict.fromkeys(b.order))
    total = sum(b.rows for b in blocks)
    starts = np.cumsum([0] + [b.rows for b in blocks])
    dense: dict[str, FloatArray] = {}
    sparse: dict[str, Sparse] = {}
    for k in order:
        if all(k in b.dense for b in blocks):
            dense[k] = np.concatenate([b.dense[k] for b in blocks])
            continue
        count = sum((b.rows if k in b.dense else len(b.sparse[k][0])) for b in blocks if k in b)
        if _sparse_enough(count, total):
            parts = [(b.present(k), at) for b, at in zip(blocks, starts, strict=False) if k in b]
            sparse[k] = (
                np.concatenate([idx + at for (idx, _), at in parts]).astype(np.int64),
                np.concatenate([v for (_, v), _ in parts]),
            )
            continue
        col = np.full(total, np.nan)
        for b, at in zip(blocks, starts, strict=False):
            if k in b.dense:
                col[at : at + b.rows] = b.dense[k]
            elif k in b.sparse:
                idx, v = b.sparse[k]
                col[idx + at] = v
        dense[k] = col
    return Columns(total, dense, sparse, list(order))
