"""JSON Lines bytes to records, and records to float64 columns: the one decoding path shared by
the reader, the tail, the catalog and the writer's sidecar.

orjson parses a block of lines about ten times faster than the stdlib (docs/performance.md,
"Reading runs"), but rejects the ``NaN`` / ``Infinity`` tokens the format allows; a block that
holds them goes to the stdlib, which reads them exactly. Without orjson installed everything
still works, only slower.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

try:
    import orjson

    _fast_loads: Callable[[bytes], Any] | None = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency; the fallback keeps reading
    _fast_loads = None

FloatArray = npt.NDArray[np.float64]
Record = dict[str, Any]

_NONFINITE = (b"NaN", b"Infinity")


def split_complete(data: bytes) -> tuple[bytes, bytes]:
    """``data`` cut after its last newline: (whole lines, torn rest still being written)."""
    end = data.rfind(b"\n") + 1
    return data[:end], data[end:]


def _loads_one(line: bytes) -> object:
    if _fast_loads is not None:
        try:
            return _fast_loads(line)
        except ValueError:
            pass  # NaN / Infinity, or an integer too big for orjson: the stdlib reads both
    return json.loads(line)


class Decoded(NamedTuple):
    records: list[Record]  # objects only: blank lines and non-objects are skipped
    bad: list[int]  # 0-based indices (among non-blank lines) of lines that did not parse
    lines: int  # non-blank lines seen


def decode_lines(data: bytes) -> Decoded:
    """Records of whole JSON Lines ``data`` (ending in a newline, or empty).

    A line that does not parse is reported in ``bad``, not raised: the caller decides whether
    it is corruption (the reader: before the last line) or a record to skip (the tail).
    """
    lines = [ln for ln in data.split(b"\n") if ln.strip()]
    if not lines:
        return Decoded([], [], 0)
    block = b"[" + b",".join(lines) + b"]"
    # One parse for the whole block is several times faster than one per line.
    loads: Callable[[bytes], Any] = json.loads
    if _fast_loads is not None and not any(tok in data for tok in _NONFINITE):
        loads = _fast_loads
    try:
        parsed = loads(block)
    except ValueError:
        parsed = None
    if isinstance(parsed, list) and len(parsed) == len(lines):
        return Decoded([r for r in parsed if isinstance(r, dict)], [], len(lines))
    records: list[Record] = []
    bad: list[int] = []
    for i, line in enumerate(lines):
        try:
            value = _loads_one(line)
        except ValueError:
            bad.append(i)
            continue
        if isinstance(value, dict):
            records.append(value)
    return Decoded(records, bad, len(lines))


def _number(value: object) -> float:
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    return math.nan


def to_columns(records: Sequence[Mapping[str, object]]) -> dict[str, FloatArray]:
    """Records as float64 columns: union of keys in first-seen order, NaN where missing.

    Values that are not numbers (JSON null, a list, a string numpy cannot parse) read as NaN:
    one odd value never costs the rest of the column. The writer's sidecar goes through here
    too, so the sidecar and the JSON Lines read back alike.
    """
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(r))
    nan = math.nan
    out: dict[str, FloatArray] = {}
    for k in keys:
        values = [r.get(k, nan) for r in records]
        try:
            col = np.array(values, dtype=np.float64)
        except (TypeError, ValueError):
            col = None
        if col is None or col.ndim != 1:  # a string, or lists (which numpy would stack)
            col = np.array([_number(v) for v in values], dtype=np.float64)
        out[k] = col
    return out


def concat_columns(blocks: Iterable[tuple[Mapping[str, FloatArray], int]]) -> dict[str, FloatArray]:
    """Blocks of columns (each with its row count) as one: keys in first-seen order, NaN
    filling the rows of blocks that lack a key."""
    blocks = list(blocks)
    if len(blocks) == 1:
        return dict(blocks[0][0])
    keys: dict[str, None] = {}
    for cols, _ in blocks:
        keys.update(dict.fromkeys(cols))
    total = sum(n for _, n in blocks)
    out: dict[str, FloatArray] = {}
    for k in keys:
        if all(k in cols for cols, _ in blocks):
            out[k] = np.concatenate([cols[k] for cols, _ in blocks])
            continue
        col = np.full(total, np.nan)
        at = 0
        for cols, n in blocks:
            if k in cols:
                col[at : at + n] = cols[k]
            at += n
        out[k] = col
    return out
