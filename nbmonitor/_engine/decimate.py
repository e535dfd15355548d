"""Chart points: at most ``max_points`` of a line, spikes kept (MinMax-LTTB, tsdownsample)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from tsdownsample import MinMaxLTTBDownsampler

FloatArray = npt.NDArray[np.float64]


def decimate(xs: FloatArray, ys: FloatArray, max_points: int) -> tuple[FloatArray, FloatArray]:
    """Non-finite points dropped (a chart cannot draw them; the alerts report them), sorted by
    x, and above ``max_points`` reduced with MinMax-LTTB keeping the overall min and max, so
    the biggest spike survives any reduction."""
    keep = np.isfinite(ys) & np.isfinite(xs)
    if not keep.all():
        xs, ys = xs[keep], ys[keep]
    # tsdownsample needs sorted x (ties are fine; checked with 0.1.5). Steps normally increase
    # already; a restarted counter is sorted, stably, rather than drawn backwards.
    if xs.size > 1 and bool((np.diff(xs) < 0).any()):
        order = np.argsort(xs, kind="stable")
        xs, ys = xs[order], ys[order]
    if xs.size > max_points:
        sampler = MinMaxLTTBDownsampler()  # type: ignore[no-untyped-call]
        idx = np.asarray(sampler.downsample(xs, ys, n_out=max_points), dtype=np.int64)
        idx = _with(idx, (int(np.argmin(ys)), int(np.argmax(ys))))
        xs, ys = xs[idx], ys[idx]
    return np.ascontiguousarray(xs, dtype=np.float64), np.ascontiguousarray(ys, dtype=np.float64)


def _with(idx: npt.NDArray[np.int64], extra: tuple[int, ...]) -> npt.NDArray[np.int64]:
    """``np.union1d(idx, extra)`` (sorted, each index once): when ``idx`` is already sorted
    and unique, as the downsampler gives it, each extra index is inserted where it belongs
    (a tenth of union1d's sort of thousands of points, for every line of every frame)."""
    if idx.size > 1 and not bool((idx[1:] > idx[:-1]).all()):
        return np.union1d(idx, extra)
    for e in sorted(set(extra)):
        at = int(np.searchsorted(idx, e))
        if at == idx.size or idx[at] != e:
            idx = np.insert(idx, at, e)
    return idx
