"""The live store as it was before sparse keys (every key a dense column), kept verbatim but
for its name as the oracle of tests/engine/test_store_sparse.py: the store must read exactly as
this one does, whichever keys it holds sparsely."""

from __future__ import annotations

import itertools
import math
import operator
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.decimate import decimate
from nbmonitor._engine.tiering import merge_pairs

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_T = TypeVar("_T", bound=np.generic)
_NAN = math.nan
# The recent tier starts small and doubles up to ``recent`` rows, so a short run (or a store
# that stays empty) does not pay for a million-row buffer.
_INITIAL_ROWS = 1024
# Columns grow by reallocation; 1.5x keeps it amortised without doubling the footprint of a
# 20-column store into a 32-column allocation.
_INITIAL_COLUMNS = 8


class DenseStore:
    """Bounded two-tier columnar store; see the module docstring.

    Every row has ``step`` and ``time``; other keys become columns the first time they are seen
    (earlier rows read NaN for them) and a key missing from a row is NaN in that row.

    In ``history()`` a bucket reads as the mean of its rows for every column, ``step`` and
    ``time`` included, so an old point sits at the centre of the steps it summarises (its step
    can be fractional). ``buckets()`` also gives each bucket's min and max.
    """

    def __init__(self, recent: int = 65_536, buckets: int = 16_384) -> None:
        if recent < 2:
            raise ValueError(f"recent must be at least 2, got {recent}")
        if buckets < 2:
            raise ValueError(f"buckets must be at least 2, got {buckets}")
        self._lock = threading.Lock()
        self._recent_cap = recent
        self._bucket_cap = buckets
        self._names: list[str] = []
        self._index: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._total = 0  # rows appended in all
        # Recent tier: shape (column capacity, row capacity); a column is one contiguous row of
        # this array so history()/tail() slice without gathering.
        self._rows = 0  # rows held in the recent tier
        self._recent: FloatArray = np.full(
            (_INITIAL_COLUMNS, min(_INITIAL_ROWS, recent)), _NAN, dtype=np.float64
        )
        # Bucket tier: bucket j summarises folded rows [j * width, (j + 1) * width); the last
        # bucket may be partly filled. Allocated on the first fold.
        self._width = 1
        self._nbuckets = 0
        self._folded = 0  # rows folded into buckets in all
        empty = (_INITIAL_COLUMNS, 0)
        self._bmin: FloatArray = np.empty(empty, dtype=np.float64)
        self._bmax: FloatArray = np.empty(empty, dtype=np.float64)
        self._bsum: FloatArray = np.empty(empty, dtype=np.float64)
        self._bcnt: IntArray = np.empty(empty, dtype=np.int64)  # non-NaN values per column
        self._brows: IntArray = np.empty(0, dtype=np.int64)  # rows per bucket
        self._add_column("step")
        self._add_column("time")

    # ------------------------------------------------------------------ writing

    def append(self, row: Mapping[str, float]) -> None:
        """Add one row; keys not seen before become new columns."""
        self.extend((row,))

    def extend(self, rows: Sequence[Mapping[str, float]]) -> None:
        """Add rows in order; one lock and one pass per column, so batches are cheap."""
        if not rows:
            return
        with self._lock:
            start = 0
            while start < len(rows):
                if self._rows == self._recent_cap:
                    self._fold()
                self._ensure_row_capacity(min(self._rows + len(rows) - start, self._recent_cap))
                n = min(len(rows) - start, self._recent.shape[1] - self._rows)
                self._write(rows[start : start + n])
                start += n

    def extend_columns(self, columns: Mapping[str, FloatArray]) -> None:
        """Add rows given as equal-length columns (a run read from disk): no row dicts."""
        if not columns:
            return
        n = len(next(iter(columns.values())))
        if any(len(v) != n for v in columns.values()):
            raise ValueError("Store.extend_columns: columns of different lengths")
        with self._lock:
            for key in columns:
                if key not in self._index:
                    self._add_column(key)
            start = 0
            while start < n:
                if self._rows == self._recent_cap:
                    self._fold()
                self._ensure_row_capacity(min(self._rows + n - start, self._recent_cap))
                k = min(n - start, self._recent.shape[1] - self._rows)
                block = self._recent[: len(self._names), self._rows : self._rows + k]
                if len(columns) < len(self._names):
                    block.fill(_NAN)
                for key, values in columns.items():
                    block[self._index[key]] = values[start : start + k]
                self._rows += k
                self._total += k
                start += k
            if n:
                self._last.update((k, float(v[-1])) for k, v in columns.items())

    def _write(self, rows: Sequence[Mapping[str, float]]) -> None:
        if not self._write_uniform(rows):
            self._write_mixed(rows)
        self._rows += len(rows)
        self._total += len(rows)

    def _write_uniform(self, rows: Sequence[Mapping[str, float]]) -> bool:
        """Fast path for the usual batch, where every row has the same keys: numpy converts
        the whole batch in one call (about 5x faster than a lookup per cell). Returns False,
        having written nothing, when the rows differ."""
        keys = tuple(rows[0])
        if not keys or any(len(row) != len(keys) for row in rows):
            return False
        getter = operator.itemgetter(*keys)
        values = map(getter, rows) if len(keys) > 1 else ((v,) for v in map(getter, rows))
        try:
            flat = np.fromiter(
                itertools.chain.from_iterable(values),
                dtype=np.float64,
                count=len(rows) * len(keys),
            )
        except (KeyError, TypeError, ValueError):
            return False
        table = flat.reshape(len(rows), len(keys))
        for key in keys:
            if key not in self._index:
                self._add_column(key)
        lo, hi = self._rows, self._rows + len(rows)
        block = self._recent[: len(self._names), lo:hi]
        if len(keys) < len(self._names):
            block.fill(_NAN)  # slots can hold data from before the last fold's shift
        block[[self._index[k] for k in keys]] = table.T
        self._last.update(zip(keys, table[-1].tolist(), strict=True))
        return True

    def _write_mixed(self, rows: Sequence[Mapping[str, float]]) -> None:
        keys: dict[str, None] = {}
        for row in rows:
            keys.update(dict.fromkeys(row))
        for key in keys:
            if key not in self._index:
                self._add_column(key)
        block = self._recent[: len(self._names), self._rows : self._rows + len(rows)]
        block.fill(_NAN)  # slots can hold data from before the last fold's shift
        for key in keys:
            values = [row.get(key, _NAN) for row in rows]
            block[self._index[key]] = values
            # "last" is the newest value written for the key, not the newest row's cell, so a
            # metric logged every 10 steps still has a last value between logs.
            for row in reversed(rows):
                if key in row:
                    self._last[key] = float(row[key])
                    break

    def _add_column(self, name: str) -> None:
        col = len(self._names)
        if col == self._recent.shape[0]:
            cap = max(col + 1, col * 3 // 2)
            self._recent = _grow_rows(self._recent, cap, _NAN)
            self._bmin = _grow_rows(self._bmin, cap, _NAN)
            self._bmax = _grow_rows(self._bmax, cap, _NAN)
            self._bsum = _grow_rows(self._bsum, cap, 0.0)
            self._bcnt = _grow_rows(self._bcnt, cap, 0)
        self._names.append(name)
        self._index[name] = col

    def _ensure_row_capacity(self, need: int) -> None:
        cap = self._recent.shape[1]
        if need <= cap:
            return
        while cap < need:
            cap = min(cap * 2, self._recent_cap)
        grown = np.full((self._recent.shape[0], cap), _NAN, dtype=np.float64)
        grown[:, : self._rows] = self._recent[:, : self._rows]
        self._recent = grown

    def _fold(self) -> None:
        """Move the oldest half of the recent tier into buckets."""
        n = self._recent_cap // 2
        ncols = len(self._names)
        block = self._recent[:ncols, :n]
        if self._bmin.shape[1] == 0:
            shape = (self._recent.shape[0], self._bucket_cap)
            self._bmin = np.full(shape, _NAN, dtype=np.float64)
            self._bmax = np.full(shape, _NAN, dtype=np.float64)
            self._bsum = np.zeros(shape, dtype=np.float64)
            self._bcnt = np.zeros(shape, dtype=np.int64)
            self._brows = np.zeros(self._bucket_cap, dtype=np.int64)
        g0 = self._folded
        while (g0 + n - 1) // self._width >= self._bucket_cap:
            self._merge_pairs()
        w = self._width
        first, last = g0 // w, (g0 + n - 1) // w
        # Segment starts inside the block: 0, then every bucket boundary after g0.
        starts = np.concatenate(([0], np.arange((first + 1) * w - g0, n, w)))
        counts = np.diff(np.append(starts, n))
        isnan = np.isnan(block)
        with np.errstate(invalid="ignore", over="ignore"):
            mins = np.fmin.reduceat(block, starts, axis=1)  # fmin skips NaN; all-NaN -> NaN
            maxs = np.fmax.reduceat(block, starts, axis=1)
            sums = np.add.reduceat(np.where(isnan, 0.0, block), starts, axis=1)
        cnts = np.add.reduceat(~isnan, starts, axis=1, dtype=np.int64)
        sl = slice(first, last + 1)
        if g0 % w:  # the first segment tops up a partly filled bucket
            mins[:, 0] = np.fmin(mins[:, 0], self._bmin[:ncols, first])
            maxs[:, 0] = np.fmax(maxs[:, 0], self._bmax[:ncols, first])
            with np.errstate(invalid="ignore", over="ignore"):
                sums[:, 0] += self._bsum[:ncols, first]
            cnts[:, 0] += self._bcnt[:ncols, first]
            counts[0] += self._brows[first]
        self._bmin[:ncols, sl] = mins
        self._bmax[:ncols, sl] = maxs
        self._bsum[:ncols, sl] = sums
        self._bcnt[:ncols, sl] = cnts
        self._brows[sl] = counts
        self._nbuckets = last + 1
        self._folded += n
        # Shift the newer half down; numpy copes with the overlap. Stale slots past the end are
        # overwritten (NaN first) by _write.
        keep = self._rows - n
        self._recent[:, :keep] = self._recent[:, n : self._rows]
        self._rows = keep

    def _merge_pairs(self) -> None:
        """Merge buckets (2j, 2j+1) into j, doubling the width; means stay count-weighted."""
        nb = self._nbuckets
        merge_pairs(self._bmin, nb, np.fmin, _NAN)
        merge_pairs(self._bmax, nb, np.fmax, _NAN)
        merge_pairs(self._bsum, nb, np.add, 0.0)
        merge_pairs(self._bcnt, nb, np.add, 0)
        self._nbuckets = merge_pairs(self._brows, nb, np.add, 0)
        self._width *= 2

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        with self._lock:
            return self._total

    @property
    def columns(self) -> tuple[str, ...]:
        """Column names in first-seen order; ``step`` and ``time`` always come first."""
        with self._lock:
            return tuple(self._names)

    @property
    def bucket_width(self) -> int:
        """Rows per full bucket (a power of two; 1 until the first fold needs more)."""
        with self._lock:
            return self._width

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (allocated capacity, not just the used part)."""
        with self._lock:
            arrays = (self._recent, self._bmin, self._bmax, self._bsum, self._bcnt, self._brows)
            return sum(int(a.nbytes) for a in arrays)

    def last(self, name: str) -> float:
        """The newest value written for ``name`` (NaN and Inf included); NaN if never seen."""
        with self._lock:
            return self._last.get(name, _NAN)

    def last_row(self) -> dict[str, float]:
        """The newest row over all columns (NaN where it lacked a key); ``{}`` when empty."""
        with self._lock:
            if self._rows == 0:
                return {}
            col = self._recent[: len(self._names), self._rows - 1]
            return {name: float(v) for name, v in zip(self._names, col, strict=True)}

    def history(self) -> dict[str, FloatArray]:
        """Every column as float64, equal lengths: bucket means, then the recent rows."""
        with self._lock:
            nb, nr = self._nbuckets, self._rows
            ncols = len(self._names)
            recent = self._recent[:ncols, :nr].copy()
            sums = self._bsum[:ncols, :nb].copy()
            cnts = self._bcnt[:ncols, :nb].copy()
            names = list(self._names)
        means = _means(sums, cnts)
        return {name: np.concatenate((means[i], recent[i])) for i, name in enumerate(names)}

    def column(self, name: str) -> FloatArray:
        """``history()[name]`` without building the other columns; KeyError if unknown."""
        with self._lock:
            i = self._index[name]
            nb, nr = self._nbuckets, self._rows
            recent = self._recent[i, :nr].copy()
            sums = self._bsum[i : i + 1, :nb].copy()
            cnts = self._bcnt[i : i + 1, :nb].copy()
        return np.concatenate((_means(sums, cnts)[0], recent))

    def select(self, names: Sequence[str]) -> dict[str, FloatArray]:
        """``column(name)`` of each of ``names`` under one lock, the bucket means taken in one
        pass (a chart reads several columns each frame); KeyError if one is unknown."""
        with self._lock:
            rows = [self._index[name] for name in names]
            nb, nr = self._nbuckets, self._rows
            recent = self._recent[rows, :nr]  # fancy indexing: a copy
            sums = self._bsum[rows, :nb]
            cnts = self._bcnt[rows, :nb]
        means = _means(sums, cnts)
        return {name: np.concatenate((means[i], recent[i])) for i, name in enumerate(names)}

    def tail(self, name: str, n: int) -> FloatArray:
        """The last ``n`` full-resolution values (fewer if the recent tier holds fewer).

        An unknown column gives an empty array, so health rules need not check first.
        """
        with self._lock:
            i = self._index.get(name)
            if i is None or n <= 0:
                return np.empty(0, dtype=np.float64)
            return self._recent[i, max(0, self._rows - n) : self._rows].copy()

    def tails(self, names: Iterable[str], n: int) -> dict[str, FloatArray]:
        """``tail(name, n)`` of each known name among ``names``, in their order, under one
        lock (the health rules read a dozen columns at every check); unknown names are left
        out."""
        with self._lock:
            hi = self._rows
            lo = max(0, hi - n) if n > 0 else hi
            index = self._index
            return {
                name: self._recent[index[name], lo:hi].copy() for name in names if name in index
            }

    def buckets(self, name: str, x: str = "step") -> dict[str, FloatArray]:
        """The bucket tier of one column: ``x`` (bucket mean of the x column), min, mean,
        max and rows (rows per bucket). KeyError if either column is unknown."""
        with self._lock:
            i, j = self._index[name], self._index[x]
            nb = self._nbuckets
            sums = self._bsum[[j, i], :nb].copy()
            cnts = self._bcnt[[j, i], :nb].copy()
            lo = self._bmin[i, :nb].copy()
            hi = self._bmax[i, :nb].copy()
            rows = self._brows[:nb].astype(np.float64)
        means = _means(sums, cnts)
        return {"x": means[0], "min": lo, "mean": means[1], "max": hi, "rows": rows}

    def series(
        self, name: str, max_points: int = 2000, x: str = "step"
    ) -> tuple[FloatArray, FloatArray]:
        """Points for one chart line, at most ``max_points``, spikes kept.

        Each bucket contributes its min and its max (both at the bucket's mean x), the recent
        tier every row; non-finite points are dropped (a chart cannot draw them; the alerts
        report them). Longer results are reduced with MinMax-LTTB, and the overall min and max
        are always kept so the biggest spike survives any reduction. Unknown columns give two
        empty arrays.
        """
        if max_points < 3:  # tsdownsample's LTTB panics below 3
            raise ValueError(f"max_points must be at least 3, got {max_points}")
        with self._lock:
            i, j = self._index.get(name), self._index.get(x)
            if i is None or j is None:
                empty = np.empty(0, dtype=np.float64)
                return empty, empty.copy()
            nb, nr = self._nbuckets, self._rows
            bx = _means(self._bsum[j : j + 1, :nb], self._bcnt[j : j + 1, :nb])[0]
            blo = self._bmin[i, :nb].copy()
            bhi = self._bmax[i, :nb].copy()
            rx = self._recent[j, :nr].copy()
            ry = self._recent[i, :nr].copy()
        xs = np.concatenate((np.repeat(bx, 2), rx))
        ys = np.concatenate((np.column_stack((blo, bhi)).ravel(), ry))
        return decimate(xs, ys, max_points)


def _means(sums: FloatArray, cnts: IntArray) -> FloatArray:
    """NaN-aware bucket means: sum / count of non-NaN values, NaN for an all-NaN bucket."""
    out = np.full(sums.shape, _NAN, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf inside a bucket is NaN, as nanmean gives
        np.divide(sums, cnts, out=out, where=cnts > 0)
    return out


def _grow_rows(arr: npt.NDArray[_T], rows: int, fill: float) -> npt.NDArray[_T]:
    """A copy of a 2-D array with ``rows`` rows, the new ones set to ``fill``."""
    grown = np.full((rows, arr.shape[1]), fill, dtype=arr.dtype)
    grown[: arr.shape[0]] = arr
    return grown
