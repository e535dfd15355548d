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
    # tsdownsample needs sorted x. Steps normally increase already; a restarted counter is
    # sorted, stably, rather than drawn backwards.
    # (Compared, not subtracted: np.diff overflows on x spanning +-1e308.)
    if xs.size > 1 and bool((xs[1:] < xs[:-1]).any()):
        order = np.argsort(xs, kind="stable")
        xs, ys = xs[order], ys[order]
    if xs.size > max_points:
        idx = np.asarray(_downsample(xs, ys, max_points), dtype=np.int64)
        idx = _with(idx, (int(np.argmin(ys)), int(np.argmax(ys))))
        xs, ys = xs[idx], ys[idx]
    return np.ascontiguousarray(xs, dtype=np.float64), np.ascontiguousarray(ys, dtype=np.float64)


def _downsample(xs: FloatArray, ys: FloatArray, n: int) -> object:
    """MinMax-LTTB's indices: binned by x where x strictly increases (a step axis), else by
    position. Ties in x (system samples stamped with the step they fell in, thousands of them
    while one long step runs; a received run's steps) make tsdownsample's bins run off its
    arrays, a Rust panic raised as a BaseException no guard catches; position bins never do,
    and system samples are regular in time."""
    sampler = MinMaxLTTBDownsampler()  # type: ignore[no-untyped-call]
    if bool((xs[1:] > xs[:-1]).all()):
        try:
            return sampler.downsample(xs, ys, n_out=n)
        except BaseException as exc:  # a Rust panic is one; anything else goes on
            if type(exc).__name__ != "PanicException":
                raise
    return sampler.downsample(ys, n_out=n)


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
