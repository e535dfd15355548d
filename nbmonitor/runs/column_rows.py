"""Rows held as columns: a stream's rows handed on without a dict per row (any thread).

A fast loop brings a thousand steps a tick, and the sampler reads them as columns
(``_engine/assemble/alike.py``). ``ColumnRows`` carries such rows on as they are, one list per
key, to everything downstream that can take columns: the store, the span log, the outbox, the
run log's encoder (``encode.py``: the same bytes, from the columns) and the writer process (a
dict of lists pickles with no dict and no key per row). It is still a ``Sequence`` of
rows: a consumer that needs rows (an exporter's per-row API) iterates it, and a row's dict is
made then, for that consumer alone.

A row's keys are the columns' keys in their order, but for the first ``absent[key]`` rows,
which lack ``key`` (the smoothed loss before the first finite loss): each row is exactly the
dict the rows would have been. ``RowParts`` is consecutive parts of one stream (lists of dicts
or ``ColumnRows``) as one sequence, each part kept as it came.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

Row = Mapping[str, object]


class ColumnRows(Sequence[dict[str, Any]]):
    """Rows of one key set as equal-length columns (``columns``: key -> list of values, in the
    rows' key order); the first ``absent[key]`` rows lack ``key``. Read-only by convention:
    the lists are shared, not copied."""

    __slots__ = ("_len", "absent", "columns")

    def __init__(
        self, columns: Mapping[str, list[Any]], absent: Mapping[str, int] | None = None
    ) -> None:
        self.columns = columns if type(columns) is dict else dict(columns)
        lengths = set(map(len, self.columns.values()))
        if len(lengths) > 1:
            raise ValueError("ColumnRows: columns of different lengths")
        self._len = lengths.pop() if lengths else 0
        kept = {k: a for k, a in (absent or {}).items() if a > 0}
        if any(k not in self.columns or a > self._len for k, a in kept.items()):
            raise ValueError("ColumnRows: absent names a key it lacks, or more rows than it has")
        self.absent: dict[str, int] = kept

    def __len__(self) -> int:
        return self._len

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key, in the rows' order."""
        return tuple(self.columns)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | Sequence[dict[str, Any]]:
        if isinstance(index, slice):
            start, stop, stride = index.indices(self._len)
            if stride == 1:
                return self.cut(start, stop)
            return [self[i] for i in range(start, stop, stride)]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("ColumnRows index out of range")
        if not self.absent:
            return {k: v[index] for k, v in self.columns.items()}
        absent = self.absent
        return {k: v[index] for k, v in self.columns.items() if index >= absent.get(k, 0)}

    def cut(self, start: int, stop: int) -> ColumnRows:
        """Rows ``[start, stop)`` (0 <= start, stop <= len), the columns sliced."""
        stop = max(start, stop)
        part = ColumnRows.__new__(ColumnRows)  # checked already: lengths and keys agree
        part.columns = {k: v[start:stop] for k, v in self.columns.items()}
        part.absent = {k: min(a - start, stop - start) for k, a in self.absent.items() if a > start}
        part._len = stop - start  # noqa: SLF001 (made here, by its own class)
        return part

    def __iter__(self) -> Iterator[dict[str, Any]]:
        keys = tuple(self.columns)
        values = zip(*self.columns.values(), strict=True)
        if self.absent:
            lacking = max(self.absent.values())
            for i, row in enumerate(itertools.islice(values, lacking)):
                yield {k: v for k, v in zip(keys, row, strict=True) if i >= self.absent.get(k, 0)}
        for row in values:
            yield dict(zip(keys, row, strict=True))

    def spans(self) -> Iterator[tuple[int, int, tuple[str, ...]]]:
        """The runs of rows with one key set: ``(start, stop, keys)``, in order (one run
        unless some rows lack keys)."""
        cuts = sorted({0, *self.absent.values()} - {self._len}) if self._len else []
        for j, start in enumerate(cuts):
            stop = cuts[j + 1] if j + 1 < len(cuts) else self._len
            yield start, stop, tuple(k for k in self.columns if self.absent.get(k, 0) <= start)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        if isinstance(other, ColumnRows) and (
            other.columns is self.columns and other.absent == self.absent
        ):
            return True
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ColumnRows({len(self)} rows, keys={list(self.columns)})"

    def __reduce__(self) -> tuple[type[ColumnRows], tuple[dict[str, list[Any]], dict[str, int]]]:
        return ColumnRows, (self.columns, self.absent)

    @classmethod
    def joined(cls, parts: Sequence[ColumnRows]) -> ColumnRows | None:
        """``parts`` (consecutive) as one, when they have the same keys in the same order and
        only the first lacks keys in some rows; else None."""
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        keys = parts[0].keys
        if any(p.keys != keys or p.absent for p in parts[1:]):
            return None
        columns: dict[str, list[Any]] = {}
        for key in keys:
            column = columns[key] = list(parts[0].columns[key])
            for part in parts[1:]:
                column += part.columns[key]  # a list's extend: a copy of its pointers
        return cls(columns, parts[0].absent)


class RowParts(Sequence[Row]):
    """Consecutive parts of one stream's rows (lists of dicts, ``ColumnRows``) as one
    sequence; ``parts`` as they came, for a consumer that takes each as it is."""

    __slots__ = ("_ends", "parts")

    def __init__(self, parts: Sequence[Sequence[Row]]) -> None:
        self.parts = [p for p in parts if len(p)]
        self._ends = list(itertools.accumulate(map(len, self.parts)))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Row]: ...

    def __getitem__(self, index: int | slice) -> Row | Sequence[Row]:
        if isinstance(index, slice):
            start, stop, stride = index.indices(len(self))
            if stride != 1:
                return list(self)[index]
            parts: list[Sequence[Row]] = []
            for part, end in zip(self.parts, self._ends, strict=True):
                begin = end - len(part)
                lo, hi = max(start, begin), min(stop, end)
                if lo < hi:
                    parts.append(part[lo - begin : hi - begin])
            return RowParts(parts)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("RowParts index out of range")
        at = bisect.bisect_right(self._ends, index)
        return self.parts[at][index - (self._ends[at] - len(self.parts[at]))]

    def __iter__(self) -> Iterator[Row]:
        return itertools.chain.from_iterable(self.parts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RowParts({len(self)} rows in {len(self.parts)} parts)"


def row_parts(rows: Sequence[Row]) -> list[Sequence[Row]]:
    """``rows`` as the parts it is made of (itself, unless a ``RowParts``)."""
    return list(rows.parts) if isinstance(rows, RowParts) else [rows]


__all__ = ["ColumnRows", "RowParts", "row_parts"]
