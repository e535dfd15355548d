"""Bounded columnar memory for per-step rows and system samples.

A run can last millions of steps, but the notebook only ever needs (a) the recent past at full
resolution, for the health rules and the right-hand end of every chart, and (b) the shape of the
whole run, spikes included. So the store keeps two tiers:

* **recent**: the newest ``recent`` rows, every value, one float64 per column per row;
* **buckets**: everything older, as at most ``buckets`` buckets of ``width`` consecutive rows,
  each holding per-column min, max and a NaN-aware sum and count (so means stay exact when
  buckets merge). When the bucket tier fills, adjacent pairs merge and the width doubles.

Memory is therefore bounded by ``columns x (recent + 4 x buckets) x 8`` bytes however long the
run; the full-resolution record lives on disk (``sinks/runlog.py``), not here.

A key logged on few rows (an eval metric every few hundred steps) would still pay for a whole
column, so a key starts **sparse** (``sparse.py``: the rows it has a value on, and the buckets
that hold one) and becomes a dense column once it fills enough of the rows it spans or its
sparse arrays would cost half a dense column; dense stays dense. Reads give exactly what a dense
column gives (NaN where the key was not logged): a sparse key folds through the same code, on
its rows laid out densely for the moment of the fold.

Only the sampler thread writes; readers may call from the main thread, so every public method
takes one lock. Reads copy what they need under the lock and do the heavy work outside it.

This module is numpy only: no torch, no widget libraries (DESIGN.md section 2).
"""

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
from nbmonitor._engine.sparse import SparseColumn
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
# A sparse key becomes dense once it has _MIN_DENSE values on at least 1/_DENSITY of the rows
# since its first recent one, or once its arrays cost 1/_SPARSE_SHARE of a dense column.
_MIN_DENSE = 16
_DENSITY = 8
_SPARSE_SHARE = 2


class Store:
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
        self._names: list[str] = []  # every key, first-seen order
        self._index: dict[str, int] = {}  # a dense key's row in the tier arrays
        self._sparse: dict[str, SparseColumn] = {}  # the keys not dense (yet)
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
        self._folded = 0  # rows folded into buckets in all (the recent tier's first row)
        empty = (_INITIAL_COLUMNS, 0)
        self._bmin: FloatArray = np.empty(empty, dtype=np.float64)
        self._bmax: FloatArray = np.empty(empty, dtype=np.float64)
        self._bsum: FloatArray = np.empty(empty, dtype=np.float64)
        self._bcnt: IntArray = np.empty(empty, dtype=np.int64)  # non-NaN values per column
        self._brows: IntArray = np.empty(0, dtype=np.int64)  # rows per bucket
        self._names.append("step")
        self._names.append("time")
        self._add_dense("step")
        self._add_dense("time")

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
            self._see(columns)
            start = 0
            while start < n:
                if self._rows == self._recent_cap:
                    self._fold()
                self._ensure_row_capacity(min(self._rows + n - start, self._recent_cap))
                k = min(n - start, self._recent.shape[1] - self._rows)
                block = self._recent[: len(self._index), self._rows : self._rows + k]
                dense = [key for key in columns if key in self._index]
                if len(dense) < len(self._index):
                    block.fill(_NAN)
                touched = []
                for key, values in columns.items():
                    part = values[start : start + k]
                    if key in self._index:
                        block[self._index[key]] = part
                    else:
                        arr = np.asarray(part, dtype=np.float64)
                        self._sparse[key].add(np.arange(self._total, self._total + k), arr)
                        touched.append(key)
                self._rows += k
                self._total += k
                self._densify(touched)
                start += k
            if n:
                self._last.update((k, float(v[-1])) for k, v in columns.items())

    def _see(self, keys: Iterable[str]) -> None:
        """Make keys not seen before sparse columns."""
        for key in keys:
            if key not in self._index and key not in self._sparse:
                self._names.append(key)
                self._sparse[key] = SparseColumn()

    def _write(self, rows: Sequence[Mapping[str, float]]) -> None:
        touched = self._write_uniform(rows)
        if touched is None:
            touched = self._write_mixed(rows)
        self._rows += len(rows)
        self._total += len(rows)
        if touched:
            self._densify(touched)

    def _write_uniform(self, rows: Sequence[Mapping[str, float]]) -> list[str] | None:
        """Fast path for the usual batch, where every row has the same keys: numpy converts
        the whole batch in one call (about 5x faster than a lookup per cell). Returns the
        sparse keys written, or None, having written nothing, when the rows differ."""
        keys = tuple(rows[0])
        if not keys or any(len(row) != len(keys) for row in rows):
            return None
        getter = operator.itemgetter(*keys)
        values = map(getter, rows) if len(keys) > 1 else ((v,) for v in map(getter, rows))
        try:
            flat = np.fromiter(
                itertools.chain.from_iterable(values),
                dtype=np.float64,
                count=len(rows) * len(keys),
            )
        except (KeyError, TypeError, ValueError):
            return None
        table = flat.reshape(len(rows), len(keys))
        self._see(keys)
        index = self._index
        dense = [j for j, key in enumerate(keys) if key in index]
        lo, hi = self._rows, self._rows + len(rows)
        block = self._recent[: len(index), lo:hi]
        if len(dense) < len(index):
            block.fill(_NAN)  # slots can hold data from before the last fold's shift
        touched: list[str] = []
        if len(dense) == len(keys):
            block[[index[k] for k in keys]] = table.T
        else:
            block[[index[keys[j]] for j in dense]] = table.T[dense]
            at = np.arange(self._total, self._total + len(rows))
            for j, key in enumerate(keys):
                if key not in index:
                    self._sparse[key].add(at, table[:, j].copy())
                    touched.append(key)
        self._last.update(zip(keys, table[-1].tolist(), strict=True))
        return touched

    def _write_mixed(self, rows: Sequence[Mapping[str, float]]) -> list[str]:
        """Any batch; returns the sparse keys written."""
        keys: dict[str, None] = {}
        for row in rows:
            keys.update(dict.fromkeys(row))
        self._see(keys)
        block = self._recent[: len(self._index), self._rows : self._rows + len(rows)]
        block.fill(_NAN)  # slots can hold data from before the last fold's shift
        touched = []
        for key in keys:
            if key in self._index:
                values = [row.get(key, _NAN) for row in rows]
                block[self._index[key]] = values
            else:
                at = [i for i, row in enumerate(rows) if key in row]
                vals = np.array([rows[i][key] for i in at], dtype=np.float64)
                self._sparse[key].add(np.asarray(at, dtype=np.int64) + self._total, vals)
                touched.append(key)
            # "last" is the newest value written for the key, not the newest row's cell, so a
            # metric logged every 10 steps still has a last value between logs.
            for row in reversed(rows):
                if key in row:
                    self._last[key] = float(row[key])
                    break
        return touched

    def _densify(self, keys: Iterable[str]) -> None:
        """Make dense the sparse keys among ``keys`` that fill enough of their rows or would
        cost half a dense column."""
        dense_bytes = self._recent.shape[1] * 8 + (self._bucket_cap * 32 if self._brows.size else 0)
        for key in keys:
            col = self._sparse.get(key)
            if col is None:
                continue
            n = col.nr
            full = n >= _MIN_DENSE and n * _DENSITY >= self._total - int(col.rows[0])
            if full or col.nbytes * _SPARSE_SHARE >= dense_bytes:
                self._make_dense(key, col)

    def _make_dense(self, key: str, col: SparseColumn) -> None:
        del self._sparse[key]
        slot = self._add_dense(key)
        self._recent[slot].fill(_NAN)
        self._recent[slot, : self._rows] = col.dense_recent(self._folded, self._folded + self._rows)
        if self._brows.size:
            mins, maxs, sums, cnts = col.dense_buckets(self._nbuckets)
            nb = self._nbuckets
            self._bmin[slot].fill(_NAN)
            self._bmax[slot].fill(_NAN)
            self._bsum[slot].fill(0.0)
            self._bcnt[slot].fill(0)
            self._bmin[slot, :nb] = mins
            self._bmax[slot, :nb] = maxs
            self._bsum[slot, :nb] = sums
            self._bcnt[slot, :nb] = cnts

    def _add_dense(self, name: str) -> int:
        col = len(self._index)
        if col == self._recent.shape[0]:
            cap = max(col + 1, col * 3 // 2)
            self._recent = _grow_rows(self._recent, cap, _NAN)
            self._bmin = _grow_rows(self._bmin, cap, _NAN)
            self._bmax = _grow_rows(self._bmax, cap, _NAN)
            self._bsum = _grow_rows(self._bsum, cap, 0.0)
            self._bcnt = _grow_rows(self._bcnt, cap, 0)
        self._index[name] = col
        return col

    def _ensure_row_capacity(self, need: int) -> None:
        cap = self._recent.shape[1]
        if need <= cap:
            return
        while cap < need:
            cap = min(cap * 2, self._recent_cap)
        # Filled once: the rows held copied, NaN after them (np.full would write both).
        grown = np.empty((self._recent.shape[0], cap), dtype=np.float64)
        grown[:, : self._rows] = self._recent[:, : self._rows]
        grown[:, self._rows :] = _NAN
        self._recent = grown

    def _fold(self) -> None:
        """Move the oldest half of the recent tier into buckets."""
        n = self._recent_cap // 2
        ncols = len(self._index)
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
        topup = bool(g0 % w)  # the first segment tops up a partly filled bucket
        sl = slice(first, last + 1)
        mins, maxs, sums, cnts = _fold_block(
            self._recent[:ncols, :n],
            starts,
            (
                self._bmin[:ncols, first],
                self._bmax[:ncols, first],
                self._bsum[:ncols, first],
                self._bcnt[:ncols, first],
            )
            if topup
            else None,
        )
        if topup:
            counts[0] += self._brows[first]
        self._bmin[:ncols, sl] = mins
        self._bmax[:ncols, sl] = maxs
        self._bsum[:ncols, sl] = sums
        self._bcnt[:ncols, sl] = cnts
        self._brows[sl] = counts
        self._fold_sparse(g0, n, starts, first, topup)
        self._nbuckets = last + 1
        self._folded += n
        # Shift the newer half down; numpy copes with the overlap. Stale slots past the end are
        # overwritten (NaN first) by _write.
        keep = self._rows - n
        self._recent[:, :keep] = self._recent[:, n : self._rows]
        self._rows = keep
        self._densify(list(self._sparse))

    def _fold_sparse(self, g0: int, n: int, starts: IntArray, first: int, topup: bool) -> None:
        """The sparse keys' part of ``_fold``: their rows laid out densely a few keys at a time
        and folded by the same ``_fold_block``, the buckets with a value kept."""
        cols = list(self._sparse.values())
        # 16 keys of a 32,768-row fold: 4 MiB for the moment of the fold.
        for at in range(0, len(cols), 16):
            chunk = cols[at : at + 16]
            block = np.stack([c.dense_recent(g0, g0 + n) for c in chunk])
            prior = None
            if topup:
                held = [c.bucket(first) for c in chunk]
                prior = (
                    np.array([b[0] for b in held], dtype=np.float64),
                    np.array([b[1] for b in held], dtype=np.float64),
                    np.array([b[2] for b in held], dtype=np.float64),
                    np.array([b[3] for b in held], dtype=np.int64),
                )
            mins, maxs, sums, cnts = _fold_block(block, starts, prior)
            for i, col in enumerate(chunk):
                has = np.flatnonzero(cnts[i])
                col.put_buckets(
                    first, has + first, mins[i, has], maxs[i, has], sums[i, has], cnts[i, has]
                )
                col.drop_rows_before(g0 + n)

    def _merge_pairs(self) -> None:
        """Merge buckets (2j, 2j+1) into j, doubling the width; means stay count-weighted."""
        nb = self._nbuckets
        for col in self._sparse.values():
            col.merge_pairs(nb)
        merge_pairs(self._bmin, nb, np.fmin, _NAN)
        merge_pairs(self._bmax, nb, np.fmax, _NAN)
        merge_pairs(self._bsum, nb, np.add, 0.0)
        merge_pairs(self._bcnt, nb, np.add, 0)
        self._nbuckets = merge_pairs(self._brows, nb, np.add, 0)
        self._width *= 2

    # ------------------------------------------------------------------ reading

    def _recent_of(self, name: str, lo: int, hi: int) -> FloatArray:
        """Recent rows ``[lo, hi)`` of a known column, a copy."""
        i = self._index.get(name)
        if i is not None:
            return self._recent[i, lo:hi].copy()
        return self._sparse[name].dense_recent(self._folded + lo, self._folded + hi)

    def _buckets_of(
        self, names: Sequence[str], nb: int
    ) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
        """Bucket min, max, sum and count of known columns, one row each: copies."""
        if all(name in self._index for name in names):
            rows = [self._index[name] for name in names]
            return (
                self._bmin[rows, :nb],
                self._bmax[rows, :nb],
                self._bsum[rows, :nb],
                self._bcnt[rows, :nb],
            )
        parts = []
        for name in names:
            i = self._index.get(name)
            if i is not None:
                parts.append(
                    (self._bmin[i, :nb], self._bmax[i, :nb], self._bsum[i, :nb], self._bcnt[i, :nb])
                )
            else:
                parts.append(self._sparse[name].dense_buckets(nb))
        if not parts:
            return (
                np.empty((0, nb), dtype=np.float64),
                np.empty((0, nb), dtype=np.float64),
                np.empty((0, nb), dtype=np.float64),
                np.empty((0, nb), dtype=np.int64),
            )
        return (
            np.stack([p[0] for p in parts]),
            np.stack([p[1] for p in parts]),
            np.stack([p[2] for p in parts]),
            np.stack([p[3] for p in parts]),
        )

    def _known(self, name: str) -> bool:
        return name in self._index or name in self._sparse

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
            dense = sum(int(a.nbytes) for a in arrays)
            return dense + sum(col.nbytes for col in self._sparse.values())

    def last(self, name: str) -> float:
        """The newest value written for ``name`` (NaN and Inf included); NaN if never seen."""
        with self._lock:
            return self._last.get(name, _NAN)

    def last_row(self) -> dict[str, float]:
        """The newest row over all columns (NaN where it lacked a key); ``{}`` when empty."""
        with self._lock:
            if self._rows == 0:
                return {}
            at, newest = self._rows - 1, self._total - 1
            out = {}
            for name in self._names:
                i = self._index.get(name)
                if i is not None:
                    out[name] = float(self._recent[i, at])
                else:
                    out[name] = self._sparse[name].value_at(newest)
            return out

    def history(self) -> dict[str, FloatArray]:
        """Every column as float64, equal lengths: bucket means, then the recent rows."""
        with self._lock:
            names = list(self._names)
            return self._select(names)

    def column(self, name: str) -> FloatArray:
        """``history()[name]`` without building the other columns; KeyError if unknown."""
        with self._lock:
            if not self._known(name):
                raise KeyError(name)
            return self._select([name])[name]

    def select(self, names: Sequence[str]) -> dict[str, FloatArray]:
        """``column(name)`` of each of ``names`` under one lock, the bucket means taken in one
        pass (a chart reads several columns each frame); KeyError if one is unknown."""
        with self._lock:
            for name in names:
                if not self._known(name):
                    raise KeyError(name)
            return self._select(names)

    def _select(self, names: Sequence[str]) -> dict[str, FloatArray]:
        nb, nr = self._nbuckets, self._rows
        index = self._index
        if all(name in index for name in names):
            rows = [index[name] for name in names]
            recent: FloatArray | list[FloatArray] = self._recent[rows, :nr]  # a copy
            sums = self._bsum[rows, :nb]
            cnts = self._bcnt[rows, :nb]
        else:
            recent = [self._recent_of(name, 0, nr) for name in names]
            sums = np.zeros((len(names), nb), dtype=np.float64)
            cnts = np.zeros((len(names), nb), dtype=np.int64)
            for i, name in enumerate(names):
                j = index.get(name)
                if j is not None:
                    sums[i] = self._bsum[j, :nb]
                    cnts[i] = self._bcnt[j, :nb]
                else:
                    self._sparse[name].sums_into(sums[i], cnts[i])
        means = _means(sums, cnts)
        return {name: np.concatenate((means[i], recent[i])) for i, name in enumerate(names)}

    def tail(self, name: str, n: int) -> FloatArray:
        """The last ``n`` full-resolution values (fewer if the recent tier holds fewer).

        An unknown column gives an empty array, so health rules need not check first.
        """
        with self._lock:
            if not self._known(name) or n <= 0:
                return np.empty(0, dtype=np.float64)
            return self._recent_of(name, max(0, self._rows - n), self._rows)

    def tails(self, names: Iterable[str], n: int) -> dict[str, FloatArray]:
        """``tail(name, n)`` of each known name among ``names``, in their order, under one
        lock (the health rules read a dozen columns at every check); unknown names are left
        out."""
        with self._lock:
            hi = self._rows
            lo = max(0, hi - n) if n > 0 else hi
            return {name: self._recent_of(name, lo, hi) for name in names if self._known(name)}

    def buckets(self, name: str, x: str = "step") -> dict[str, FloatArray]:
        """The bucket tier of one column: ``x`` (bucket mean of the x column), min, mean,
        max and rows (rows per bucket). KeyError if either column is unknown."""
        with self._lock:
            for key in (name, x):
                if not self._known(key):
                    raise KeyError(key)
            nb = self._nbuckets
            mins, maxs, sums, cnts = self._buckets_of([x, name], nb)
            lo = mins[1].copy()
            hi = maxs[1].copy()
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
            if not self._known(name) or not self._known(x):
                empty = np.empty(0, dtype=np.float64)
                return empty, empty.copy()
            nb, nr = self._nbuckets, self._rows
            mins, maxs, sums, cnts = self._buckets_of([x, name], nb)
            bx = _means(sums[0:1], cnts[0:1])[0]
            blo = mins[1]
            bhi = maxs[1]
            rx = self._recent_of(x, 0, nr)
            ry = self._recent_of(name, 0, nr)
        xs = np.concatenate((np.repeat(bx, 2), rx))
        ys = np.concatenate((np.column_stack((blo, bhi)).ravel(), ry))
        return decimate(xs, ys, max_points)


def _fold_block(
    block: FloatArray,
    starts: IntArray,
    prior: tuple[FloatArray, FloatArray, FloatArray, IntArray] | None,
) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
    """Per-segment min, max, NaN-free sum and count of each row of ``block``; with ``prior``
    (one bucket's min, max, sum and count per row), the first segment tops that bucket up."""
    isnan = np.isnan(block)
    with np.errstate(invalid="ignore", over="ignore"):
        mins = np.fmin.reduceat(block, starts, axis=1)  # fmin skips NaN; all-NaN -> NaN
        maxs = np.fmax.reduceat(block, starts, axis=1)
        sums = np.add.reduceat(np.where(isnan, 0.0, block), starts, axis=1)
    cnts = np.add.reduceat(~isnan, starts, axis=1, dtype=np.int64)
    if prior is not None:
        mins[:, 0] = np.fmin(mins[:, 0], prior[0])
        maxs[:, 0] = np.fmax(maxs[:, 0], prior[1])
        with np.errstate(invalid="ignore", over="ignore"):
            sums[:, 0] += prior[2]
        cnts[:, 0] += prior[3]
    return mins, maxs, sums, cnts


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
