"""Vectorised statistics over windows of steps, shared by the rules: NaN-safe row medians
and maxima, levels held over consecutive steps, and whether a column is logged every step.

Written out instead of ``np.nanmedian``/``np.nanmax``, which warn on all-NaN rows: the test
suite treats warnings as errors and ``warnings.catch_warnings`` is not thread-safe.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.intp]

# A NaN in a column is ambiguous (not logged that step, or logged as NaN); a NaN counts as a
# non-finite value only when the column was filled on this fraction of at least DENSE_MIN_ROWS
# preceding rows, i.e. the value is logged every step.
DENSE_FRACTION = 0.9
DENSE_MIN_ROWS = 8


def finite_or_nan(a: FloatArray) -> FloatArray:
    return np.where(np.isfinite(a), a, np.nan)


def row_medians(a: FloatArray) -> tuple[FloatArray, IntArray]:
    """Median of the finite values of each row of a 2-D array, and how many there were."""
    rows, cols = a.shape
    if cols == 0:
        return np.full(rows, np.nan), np.zeros(rows, dtype=np.intp)
    finite = np.isfinite(a)
    if finite.all():  # the usual case, without the per-row bookkeeping
        ordered = np.sort(a, axis=1)
        median = 0.5 * (ordered[:, (cols - 1) // 2] + ordered[:, cols // 2])
        return median, np.full(rows, cols, dtype=np.intp)
    count = finite.sum(axis=1)
    ordered = np.sort(np.where(finite, a, np.nan), axis=1)  # NaN sorts last
    index = np.arange(rows)
    lo = np.maximum((count - 1) // 2, 0)
    hi = np.minimum(np.maximum(count // 2, 0), cols - 1)
    median = 0.5 * (ordered[index, lo] + ordered[index, hi])
    return np.where(count > 0, median, np.nan), count


def row_max(a: FloatArray) -> tuple[FloatArray, IntArray]:
    """Largest finite value of each row (NaN if none) and its column."""
    rows, cols = a.shape
    if cols == 0:
        return np.full(rows, np.nan), np.zeros(rows, dtype=np.intp)
    finite = np.isfinite(a)
    if finite.all():
        where = np.argmax(a, axis=1)
        return a[np.arange(rows), where], where
    where = np.argmax(np.where(finite, a, -np.inf), axis=1)
    value = a[np.arange(rows), where]
    return np.where(finite.any(axis=1), value, np.nan), where


# Windows up to this long take their minima by shifted np.minimum (a few calls) rather than
# a strided view (whose setup costs more than the work for the short windows the rules use).
SHIFTED_MINIMA = 8


def window_minima(seg: FloatArray, m: int) -> FloatArray:
    """Per row, the minimum of each window of ``m`` consecutive columns (NaN if the window
    holds one); ``seg`` has at least ``m`` columns."""
    width = seg.shape[1] - m + 1
    if m > SHIFTED_MINIMA:
        mins: FloatArray = np.lib.stride_tricks.sliding_window_view(seg, m, axis=1).min(axis=2)
        return mins
    mins = seg[:, :width].copy()
    for k in range(1, m):
        np.minimum(mins, seg[:, k : k + width], out=mins)
    return mins


def sustained(
    a: FloatArray, start: int, m: int, above: float | None = None
) -> tuple[FloatArray, IntArray]:
    """Per row, the largest level held for ``m`` consecutive columns among windows that end at
    or after column ``start``, and the column where that window begins. With ``above``: per
    row, the column where the first such window held above ``above`` begins (-1: none), in
    both results.

    Small batches give heavy-tailed per-step losses and gradient norms (one batch 20x the
    median is normal with batch size 4): a single step says little, a run of steps does.
    A NaN inside a window breaks it.
    """
    lo = max(0, start - (m - 1))
    seg = a[:, lo:]
    rows = a.shape[0]
    if seg.shape[1] < m:
        return np.full(rows, np.nan), np.zeros(rows, dtype=np.intp)
    mins = window_minima(seg, m)
    if above is not None:
        hit = mins > above
        first = np.where(hit.any(axis=1), np.argmax(hit, axis=1) + lo, -1)
        return first.astype(np.float64), first
    value, where = row_max(mins)
    return value, where + lo


def abrupt(
    a: FloatArray, start: int, m: int, before: int, factor: float, floor: FloatArray
) -> tuple[FloatArray, IntArray]:
    """Like ``sustained``, among only the windows held above ``floor`` (per row) and above
    ``factor`` x the median of the ``before`` columns just before them (a rise that is
    abrupt, not one over tens of steps): per row the largest such level (NaN if none) and the
    column where its window begins. The medians are taken for the windows above ``floor``
    only, so a quiet check costs one pass of window minima."""
    rows, cols = a.shape
    lo = max(start - (m - 1), before)
    if cols - lo < m:
        return np.full(rows, np.nan), np.zeros(rows, dtype=np.intp)
    mins = window_minima(a[:, lo:], m)
    with np.errstate(invalid="ignore"):
        r, c = np.nonzero(mins > np.where(np.isnan(floor), np.inf, floor)[:, None])
    steep = np.zeros(mins.shape, dtype=bool)
    if r.size:
        first = c + lo - before  # each candidate window's prior block starts here
        prior = np.sort(a[r[:, None], first[:, None] + np.arange(before)], axis=1)
        # NaN sorts last: a block with NaN reads high, so a gap never makes a rise abrupt.
        mid = 0.5 * (prior[:, (before - 1) // 2] + prior[:, before // 2])
        with np.errstate(invalid="ignore"):
            steep[r, c] = mins[r, c] > factor * np.where(np.isnan(mid), np.inf, mid)
    value, where = row_max(np.where(steep, mins, np.nan))
    return value, where + lo


def trailing_counts(hits: BoolArray, window: int) -> tuple[IntArray, IntArray]:
    """For each position, how many ``hits`` the trailing ``window`` positions (itself
    included) hold, and how many positions that window has (fewer at the start)."""
    cum = np.concatenate((np.zeros(1, dtype=np.intp), np.cumsum(hits, dtype=np.intp)))
    index = np.arange(hits.size)
    low = np.maximum(0, index + 1 - window)
    return cum[index + 1] - cum[low], index + 1 - low


def dense(values: FloatArray) -> bool:
    """Whether a column is filled (finite or infinite, not NaN) on nearly every row."""
    return values.size >= DENSE_MIN_ROWS and bool(np.mean(~np.isnan(values)) >= DENSE_FRACTION)


__all__ = [
    "BoolArray",
    "FloatArray",
    "IntArray",
    "abrupt",
    "dense",
    "finite_or_nan",
    "row_max",
    "row_medians",
    "sustained",
    "trailing_counts",
    "window_minima",
]
