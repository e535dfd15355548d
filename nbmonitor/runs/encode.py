"""The writer's encoder: rows to JSON Lines bytes and to the sidecar's columns, in one pass.

The bytes are exactly those of :func:`~nbmonitor.runs.format.encode_lines` (the json module's
encoder: keys escaped, ``ensure_ascii``, floats by ``float.__repr__``, non-finite floats as
``NaN`` / ``Infinity`` / ``-Infinity``), made cheaper for the rows a run writes nearly always:
a dict whose keys are all ``str`` and whose values are all exactly ``float``, with keys (in their
order) that came before. Such a row is one ``template % values``: the keys were escaped once,
when the template of that key set was built (the second time it came: keys that never recur
cost no template), and the values are formatted by one C call (``%s`` of a
float is its repr, the json module's own text for a finite float). A row with a non-finite
value formats its values the same way and spells ``nan`` / ``inf`` as JSON does: the only
letters a float's repr can hold are those and ``e``, so the replace cannot touch anything else,
and the keys are not in the text it runs over. Every other row (an int, a bool, a string,
``None``, a nested value, a float subclass such as ``numpy.float64`` whose repr is not the
json module's text, a key that is not a ``str``) goes to the json encoder, as before.

What it costs is nearly all the floats' repr (``float.__repr__``, the shortest text that reads
back bit for bit): about 0.1 us for a short value and 0.4-0.6 us for 17 digits on a 2-core VM,
over 90 % of a step row's encoding (benchmarks/NOTES.md, "The run log's worker per row").

The sidecar's columns come from the value tuples the templates already took, one numpy call
per key set instead of one list per key: bit for bit what :func:`~nbmonitor.runs.decode.
to_columns` makes of the same rows (keys in first-seen order, NaN where a row lacks a key, a key
in fewer than half the rows held sparse, one NaN). A batch with a row that went to the json
encoder is handed to ``to_columns`` whole.

One encoder per stream (its key sets recur); any thread, one call at a time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from nbmonitor.runs.column_rows import ColumnRows, RowParts
from nbmonitor.runs.decode import (
    Columns,
    FloatArray,
    IntArray,
    Sparse,
    _floats,
    to_columns,
)
from nbmonitor.runs.format import JSON_ENCODER

# Key sets a stream's encoder remembers (with a template once seen twice), and the keys they
# hold in all: past either it starts again (a stream whose keys change every row gains nothing
# from templates, and must not grow).
MAX_KEY_SETS = 256
MAX_KEYS_HELD = 1 << 20


class _Template:
    """One key set's line: ``text % values`` is the row's JSON line (newline included)."""

    __slots__ = ("keys", "letters", "text", "types", "values")

    def __init__(self, keys: tuple[str, ...]) -> None:
        enc = JSON_ENCODER.encode
        self.keys = keys
        body = ",".join(enc(k).replace("%", "%%") + ":%s" for k in keys)
        self.text = "{" + body + "}\n"
        self.types = (float,) * len(keys)
        # A key text that holds "nan" or "inf" ("financial") would be spelled too: such a key
        # set spells the values alone.
        self.letters = "nan" in self.text or "inf" in self.text
        self.values = ",".join(["%s"] * len(keys))

    def spell(self, line: str, values: tuple[float, ...]) -> str:
        """``line`` (``text % values``) with the non-finite floats spelled as JSON spells them:
        ``nan`` / ``inf`` / ``-inf`` are the only letters a float's repr holds beside ``e``, and
        the values sit between ``:`` and ``,`` or ``}``, so no other text can match."""
        if not self.letters:
            return line.replace("nan", "NaN").replace("inf", "Infinity")
        spelled = (self.values % values).replace("nan", "NaN").replace("inf", "Infinity")
        return self.text % tuple(spelled.split(","))


class _Taken:
    """What one batch's rows left for its columns: each row's template (None: the json
    encoder's) and value tuple."""

    __slots__ = ("templates", "values")

    def __init__(self) -> None:
        self.templates: list[_Template | None] = []
        self.values: list[tuple[float, ...]] = []


class LineEncoder:
    """Rows of one stream as JSON Lines, with the templates of the key sets seen so far."""

    def __init__(self) -> None:
        # Key set -> its template, or None: seen once (a template is built the second time,
        # so keys that never recur cost no template), or keys that are not all str.
        self._templates: dict[tuple[object, ...], _Template | None] = {}
        self._held = 0  # keys in all the key sets above

    def encode(
        self,
        rows: Sequence[Mapping[str, object]],
        *,
        columns: bool = False,
        pause: Callable[[], None] | None = None,
        every: int = 32,
    ) -> tuple[bytes, Columns | None]:
        """``rows`` as JSON Lines bytes (one line each, the bytes of ``encode_lines``), and
        with ``columns`` their float64 columns (``to_columns``'s). With ``pause``, rows are
        encoded ``every`` at a time with ``pause()`` between (a live run lets the training
        thread take the GIL there). TypeError/ValueError as the json encoder raises them.

        ``rows`` held as columns (``ColumnRows``, parts of them in a ``RowParts``) are encoded
        from their columns when their values are all floats: the same bytes and columns, no
        dict per row."""
        if isinstance(rows, RowParts):
            # Each part as it is: a line depends on its row alone.
            made = []
            for i, part in enumerate(rows.parts):
                if i and pause is not None:
                    pause()
                made.append(self.encode(part, columns=columns, pause=pause, every=every))
            data = b"".join(d for d, _ in made)
            if not columns:
                return data, None
            return data, _columns_of_parts(rows.parts)
        if isinstance(rows, ColumnRows):
            got = self._from_columns(rows, columns, pause, every)
            if got is not None:
                return got
        taken = _Taken() if columns else None
        if pause is None or len(rows) <= every:
            text = self._lines(rows, taken)
        else:
            parts = []
            for start in range(0, len(rows), every):
                if start:
                    pause()
                parts.append(self._lines(rows[start : start + every], taken))
            text = "".join(parts)
        data = text.encode()  # ASCII: the json module escapes every other character
        if taken is None:
            return data, None
        if None in taken.templates:
            return data, to_columns(rows)
        return data, _columns(taken)

    def _from_columns(
        self,
        rows: ColumnRows,
        columns: bool,
        pause: Callable[[], None] | None,
        every: int,
    ) -> tuple[bytes, Columns | None] | None:
        """``encode`` of rows held as columns: each run of rows of one key set by its
        template, one ``template % values`` a row straight from the columns. None when a
        value is not exactly a float or a key not a str (then row by row, the json encoder's
        way)."""
        cols = rows.columns
        if any(set(map(type, col)) - {float} for col in cols.values()):
            return None
        out: list[str] = []
        done = 0  # rows encoded since the last pause
        for start, stop, keys in rows.spans():
            template = self._template(keys) or self._template(keys)  # made the second time
            if template is None:  # a key that is not a str
                return None
            whole = start == 0 and stop == len(rows)
            part = [cols[k] if whole else cols[k][start:stop] for k in keys]
            text = template.text
            values: Iterator[tuple[float, ...]] = (
                zip(*part, strict=True) if part else itertools.repeat((), stop - start)
            )
            lines: list[str] = []
            if pause is None or len(rows) <= every:
                lines = list(map(text.__mod__, values))
            else:
                while len(lines) < stop - start:
                    if done == every:
                        pause()
                        done = 0
                    take = min(every - done, stop - start - len(lines))
                    lines += map(text.__mod__, itertools.islice(values, take))
                    done += take
            block = "".join(lines)
            # A non-finite value (a column whose sum is not finite holds one; a key logged as
            # NaN every step, often): spelled as JSON spells it. The keys' text holds no
            # "nan" or "inf" (template.letters) and a finite float's repr holds neither, so
            # the whole block is spelled at once, as each of its lines would be.
            if not all(map(math.isfinite, map(sum, part))):
                if not template.letters:
                    block = block.replace("nan", "NaN").replace("inf", "Infinity")
                else:  # such a key (rare): the values alone, line by line
                    spelled = {
                        i
                        for col in part
                        if not math.isfinite(sum(col))
                        for i, v in enumerate(col)
                        if not math.isfinite(v)
                    }
                    for i in sorted(spelled):
                        lines[i] = template.spell(lines[i], tuple(col[i] for col in part))
                    block = "".join(lines)
            out.append(block)
        data = "".join(out).encode()  # ASCII: the keys were escaped, the values are floats
        return data, (_columns_of(rows) if columns else None)

    def _template(self, keys: tuple[object, ...]) -> _Template | None:
        templates = self._templates
        if keys in templates:
            template = templates[keys]
            if template is None and all(type(k) is str for k in keys):
                template = templates[keys] = _Template(keys)  # type: ignore[arg-type]
            return template
        if len(templates) >= MAX_KEY_SETS or self._held > MAX_KEYS_HELD:
            templates.clear()
            self._held = 0
        templates[keys] = None
        self._held += len(keys)
        return None

    def _lines(self, rows: Sequence[Mapping[str, object]], taken: _Taken | None) -> str:
        enc = JSON_ENCODER.encode
        isfinite = math.isfinite
        out: list[str] = []
        last_keys: tuple[object, ...] | None = None
        template: _Template | None = None
        for row in rows:
            r = row if type(row) is dict else dict(row)
            keys = tuple(r)
            if keys != last_keys:
                template, last_keys = self._template(keys), keys
            if template is not None:
                values: tuple[Any, ...] = tuple(r.values())
                if tuple(map(type, values)) == template.types:
                    line = template.text % values
                    if not isfinite(sum(values)):  # NaN or an infinity (or a sum past float64)
                        line = template.spell(line, values)
                    out.append(line)
                    if taken is not None:
                        taken.templates.append(template)
                        taken.values.append(values)
                    continue
            out.append(enc(r) + "\n")
            if taken is not None:
                taken.templates.append(None)
        return "".join(out)


def _columns_of_parts(parts: Sequence[Sequence[Mapping[str, object]]]) -> Columns:
    """``to_columns`` of the rows of ``parts`` (lists of rows, ``ColumnRows``) one after the
    other, bit for bit, without a dict per row of the parts held as columns: which rows hold
    each key, and their values, part by part."""
    where: dict[str, list[IntArray]] = {}
    values: dict[str, list[Any]] = {}
    at = 0
    for part in parts:
        n = len(part)
        if isinstance(part, ColumnRows):
            absent = part.absent
            for key in sorted(part.columns, key=lambda k: absent.get(k, 0)):
                lacking = absent.get(key, 0)
                if lacking >= n:
                    continue
                col = part.columns[key]
                where.setdefault(key, []).append(np.arange(at + lacking, at + n, dtype=np.int64))
                values.setdefault(key, []).extend(col[lacking:] if lacking else col)
        else:
            rows: dict[str, list[int]] = {}
            for i, row in enumerate(part):
                for key, value in row.items():
                    if key in rows:
                        rows[key].append(at + i)
                        values[key].append(value)
                    else:
                        rows[key] = [at + i]
                        values.setdefault(key, []).append(value)
            for key, got in rows.items():
                where.setdefault(key, []).append(np.array(got, dtype=np.int64))
        at += n
    dense: dict[str, FloatArray] = {}
    sparse: dict[str, Sparse] = {}
    for key, vs in values.items():
        col = _floats(vs)
        if len(vs) == at:
            dense[key] = col
            continue
        idx = np.concatenate(where[key])
        if 2 * len(vs) < at:
            sparse[key] = (idx, col)
        else:
            full = np.full(at, np.nan)
            full[idx] = col
            dense[key] = full
    return Columns(at, dense, sparse, list(values))


def _columns_of(rows: ColumnRows) -> Columns:
    """``to_columns`` of rows held as columns (all floats), bit for bit: keys in the order the
    rows first hold them, NaN where a row lacks a key, a key in fewer than half the rows
    sparse, one NaN."""
    n, absent = len(rows), rows.absent
    dense: dict[str, FloatArray] = {}
    sparse: dict[str, Sparse] = {}
    order = sorted(rows.columns, key=lambda k: absent.get(k, 0))  # stable: first-seen order
    order = [k for k in order if absent.get(k, 0) < n]  # a key no row holds is not a column
    for key in order:
        lacking = absent.get(key, 0)
        values = rows.columns[key]
        col = np.array(values if not lacking else values[lacking:], dtype=np.float64)
        nan = np.isnan(col)
        if nan.any():
            col[nan] = np.nan
        if not lacking:
            dense[key] = col
        elif 2 * (n - lacking) < n:
            sparse[key] = (np.arange(lacking, n, dtype=np.int64), col)
        else:
            full = np.full(n, np.nan)
            full[lacking:] = col
            dense[key] = full
    return Columns(n, dense, sparse, order)


def _block(values: list[tuple[float, ...]]) -> FloatArray:
    """Value tuples of one key set as a (keys, rows) float64 array, NaN as the one NaN."""
    block = np.array(values, dtype=np.float64).T.copy()
    nan = np.isnan(block)
    if nan.any():
        block[nan] = np.nan
    return block


def _columns(taken: _Taken) -> Columns:
    """``to_columns`` of rows that were all encoded by templates, from their value tuples."""
    templates, values = taken.templates, taken.values
    rows = len(values)
    if not rows:
        return Columns(0)
    first = templates[0]
    assert first is not None
    if templates.count(first) == rows:  # one key set: the common case
        block = _block(values)
        return Columns(rows, dict(zip(first.keys, block, strict=True)), {}, list(first.keys))
    # Several key sets: a block per key set, then each key from the blocks that hold it.
    where: dict[_Template, list[int]] = {}
    grouped: dict[_Template, list[tuple[float, ...]]] = {}
    for i, (t, v) in enumerate(zip(templates, values, strict=True)):
        assert t is not None
        if t in where:
            where[t].append(i)
            grouped[t].append(v)
        else:
            where[t], grouped[t] = [i], [v]
    # Each key's blocks, in the order their key sets first came and the keys in each in their
    # order: the keys' first-seen order over the rows.
    blocks = {t: (np.array(where[t], dtype=np.int64), _block(vs)) for t, vs in grouped.items()}
    holders: dict[str, list[tuple[_Template, int]]] = {}
    for t in blocks:
        for j, key in enumerate(t.keys):
            if key in holders:
                holders[key].append((t, j))
            else:
                holders[key] = [(t, j)]
    made: dict[str, FloatArray | Sparse] = {}
    for t, (at, block) in blocks.items():
        # The keys of one key set only (a wide layers row's): all at once.
        only = [j for j, key in enumerate(t.keys) if len(holders[key]) == 1]
        if not only:
            continue
        if 2 * len(at) < rows:
            made.update((t.keys[j], (at, block[j])) for j in only)
        else:
            full = np.full((len(only), rows), np.nan)
            full[:, at] = block[only]
            made.update((t.keys[j], col) for j, col in zip(only, full, strict=True))
    for key, held in holders.items():
        if len(held) == 1:
            continue
        parts = [(blocks[t][0], blocks[t][1][j]) for t, j in held]
        count = sum(len(at) for at, _ in parts)
        if 2 * count < rows:
            at = np.concatenate([i for i, _ in parts])
            ordered = np.argsort(at, kind="stable")
            made[key] = (at[ordered], np.concatenate([v for _, v in parts])[ordered])
            continue
        col = np.empty(rows) if count == rows else np.full(rows, np.nan)
        for at, part in parts:
            col[at] = part
        made[key] = col
    dense: dict[str, FloatArray] = {}
    sparse: dict[str, Sparse] = {}
    for key in holders:
        value = made[key]
        if isinstance(value, tuple):
            sparse[key] = value
        else:
            dense[key] = value
    return Columns(rows, dense, sparse, list(holders))


__all__ = ["MAX_KEYS_HELD", "MAX_KEY_SETS", "LineEncoder"]
