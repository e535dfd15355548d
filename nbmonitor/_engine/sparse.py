"""A store key held sparsely: the rows it has a value on and the buckets that hold one.

The store's dense column costs 8 bytes per row it can hold whatever the key logs; this holds
the recent tier as (global row, value) pairs and the bucket tier as (bucket, min, max, sum,
count) for the buckets with a value, in arrays that grow by doubling. An absent row is NaN and
an absent bucket is (NaN, NaN, 0.0, 0), exactly what a dense column holds there, so
``dense_recent``/``dense_buckets`` give the store's dense layout back bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_NAN = float("nan")
_INITIAL = 8


def _grown(arr: npt.NDArray[Any], need: int) -> npt.NDArray[Any]:
    if need <= len(arr):
        return arr
    out = np.empty(max(need, 2 * len(arr), _INITIAL), dtype=arr.dtype)
    out[: len(arr)] = arr
    return out


class SparseColumn:
    """One sparse key; the store holds the lock and says which rows and buckets exist."""

    __slots__ = ("bcnt", "bidx", "bmax", "bmin", "bsum", "nb", "nr", "rows", "vals")

    def __init__(self) -> None:
        self.rows: IntArray = np.empty(0, dtype=np.int64)  # global row numbers, ascending
        self.vals: FloatArray = np.empty(0, dtype=np.float64)  # never NaN
        self.nr = 0
        self.bidx: IntArray = np.empty(0, dtype=np.int64)  # bucket numbers, ascending
        self.bmin: FloatArray = np.empty(0, dtype=np.float64)
        self.bmax: FloatArray = np.empty(0, dtype=np.float64)
        self.bsum: FloatArray = np.empty(0, dtype=np.float64)
        self.bcnt: IntArray = np.empty(0, dtype=np.int64)  # > 0 for every bucket held
        self.nb = 0

    @property
    def nbytes(self) -> int:
        arrays = (self.rows, self.vals, self.bidx, self.bmin, self.bmax, self.bsum, self.bcnt)
        return sum(int(a.nbytes) for a in arrays)

    # ------------------------------------------------------------------ writing

    def add(self, rows: IntArray, values: FloatArray) -> None:
        """Append values at ascending global ``rows`` past the last one; NaN ones are left out
        (an absent row reads NaN)."""
        keep = ~np.isnan(values)
        if not keep.all():
            rows, values = rows[keep], values[keep]
        k = len(rows)
        if not k:
            return
        end = self.nr + k
        self.rows = _grown(self.rows, end)
        self.vals = _grown(self.vals, end)
        self.rows[self.nr : end] = rows
        self.vals[self.nr : end] = values
        self.nr = end

    def drop_rows_before(self, row: int) -> None:
        """Forget the recent values on global rows before ``row`` (folded into buckets)."""
        cut = int(np.searchsorted(self.rows[: self.nr], row))
        if cut:
            keep = self.nr - cut
            self.rows[:keep] = self.rows[cut : self.nr]
            self.vals[:keep] = self.vals[cut : self.nr]
            self.nr = keep

    def put_buckets(
        self,
        first: int,
        idx: IntArray,
        mins: FloatArray,
        maxs: FloatArray,
        sums: FloatArray,
        cnts: IntArray,
    ) -> None:
        """Replace the buckets from ``first`` on with those given (ascending, counts > 0)."""
        start = int(np.searchsorted(self.bidx[: self.nb], first))
        end = start + len(idx)
        for name in ("bidx", "bmin", "bmax", "bsum", "bcnt"):
            setattr(self, name, _grown(getattr(self, name), end))
        self.bidx[start:end] = idx
        self.bmin[start:end] = mins
        self.bmax[start:end] = maxs
        self.bsum[start:end] = sums
        self.bcnt[start:end] = cnts
        self.nb = end

    def bucket(self, j: int) -> tuple[float, float, float, int]:
        """Bucket ``j`` as the dense tier holds it: (min, max, sum, count)."""
        i = int(np.searchsorted(self.bidx[: self.nb], j))
        if i < self.nb and self.bidx[i] == j:
            return (
                float(self.bmin[i]),
                float(self.bmax[i]),
                float(self.bsum[i]),
                int(self.bcnt[i]),
            )
        return (_NAN, _NAN, 0.0, 0)

    def merge_pairs(self, used: int) -> None:
        """The dense tier's ``tiering.merge_pairs`` on the buckets held: (2j, 2j+1) into j with
        the same operations and fills, an odd last bucket moved down alone."""
        nb = self.nb
        if not nb:
            return
        idx = self.bidx[:nb]
        new = idx // 2
        out, pos = np.unique(new, return_inverse=True)
        even = idx % 2 == 0
        alone = (idx == used - 1) & (used % 2 == 1)

        def merged(arr: npt.NDArray[Any], op: Callable[..., Any], fill: float) -> Any:
            left = np.full(len(out), fill, dtype=arr.dtype)
            right = np.full(len(out), fill, dtype=arr.dtype)
            left[pos[even]] = arr[:nb][even]
            right[pos[~even]] = arr[:nb][~even]
            with np.errstate(invalid="ignore", over="ignore"):
                res = op(left, right)
            res[pos[alone]] = arr[:nb][alone]
            return res

        m = len(out)
        mins = merged(self.bmin, np.fmin, _NAN)
        maxs = merged(self.bmax, np.fmax, _NAN)
        sums = merged(self.bsum, np.add, 0.0)
        cnts = merged(self.bcnt, np.add, 0)
        self.bidx[:m] = out
        self.bmin[:m] = mins
        self.bmax[:m] = maxs
        self.bsum[:m] = sums
        self.bcnt[:m] = cnts
        self.nb = m

    # ------------------------------------------------------------------ reading

    def dense_recent(self, lo: int, hi: int) -> FloatArray:
        """Global rows ``[lo, hi)`` as a dense column would hold them."""
        out = np.full(hi - lo, _NAN, dtype=np.float64)
        rows = self.rows[: self.nr]
        a, b = np.searchsorted(rows, (lo, hi))
        out[rows[a:b] - lo] = self.vals[a:b]
        return out

    def value_at(self, row: int) -> float:
        if self.nr and self.rows[self.nr - 1] == row:
            return float(self.vals[self.nr - 1])
        return _NAN

    def sums_into(self, sums: FloatArray, cnts: IntArray) -> None:
        """Write the buckets' sums and counts into zeroed ``sums``/``cnts`` (their length is the
        number of buckets read)."""
        k = int(np.searchsorted(self.bidx[: self.nb], len(sums)))
        idx = self.bidx[:k]
        sums[idx] = self.bsum[:k]
        cnts[idx] = self.bcnt[:k]

    def dense_buckets(self, nb: int) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
        """Buckets ``[0, nb)`` as the dense tier holds them: min, max, sum, count."""
        mins = np.full(nb, _NAN, dtype=np.float64)
        maxs = np.full(nb, _NAN, dtype=np.float64)
        sums = np.zeros(nb, dtype=np.float64)
        cnts = np.zeros(nb, dtype=np.int64)
        k = int(np.searchsorted(self.bidx[: self.nb], nb))
        idx = self.bidx[:k]
        mins[idx] = self.bmin[:k]
        maxs[idx] = self.bmax[:k]
        sums[idx] = self.bsum[:k]
        cnts[idx] = self.bcnt[:k]
        return mins, maxs, sums, cnts
