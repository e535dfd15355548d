"""Step time as people read it, and the phases stacked per step, from the steps store.

``step_time_band``: the rolling median of the step time with the min and max of the same
windows, so that the spikes of a noisy machine show as a band instead of drowning the line;
``smoothed``: the same rolling median of another rate (samples/s, tokens/s).
``phase_stack``: each phase's mean seconds per step over bins of consecutive steps, aligned on
one x so that a chart can stack them (their sum is the step time).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.store import Store
from nbmonitor.records import PHASE_KEYS, PHASES

FloatArray = npt.NDArray[np.float64]

# Points of each line sent to a chart, and the fewest rows a rolling window spans.
BAND_POINTS = 400
MIN_WINDOW = 9
PHASE_POINTS = 300


def _windows(store: Store, key: str, points: int) -> tuple[FloatArray, FloatArray] | None:
    """(x, windows): the last step of each rolling window of ``key`` and its rows, windows of
    ``max(MIN_WINDOW, rows / points)`` rows, one per ``rows / points`` rows (older rows are
    the store's bucket means); None without values."""
    if key not in store.columns or "step" not in store.columns:
        return None
    columns = store.select(("step", key))
    x, y = columns["step"], columns[key]
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = y.size
    if n == 0:
        return None
    stride = max(1, math.ceil(n / points))
    width = min(n, max(MIN_WINDOW, stride))
    windows = np.lib.stride_tricks.sliding_window_view(y, width)[::stride]
    xs = np.lib.stride_tricks.sliding_window_view(x, width)[::stride, -1]
    return xs, windows


def _median(windows: FloatArray) -> FloatArray:
    # Sorted by hand: np.median imports numpy.ma on first use, holding the GIL (the training
    # thread waits).
    width = windows.shape[1]
    ordered = np.sort(windows, axis=1)
    return 0.5 * (ordered[:, (width - 1) // 2] + ordered[:, width // 2])


def step_time_band(store: Store, points: int = BAND_POINTS) -> dict[str, tuple[FloatArray, ...]]:
    """``{"step_time_median"|"step_time_min"|"step_time_max": (x, y)}``, or ``{}`` without
    step times: the rolling median of the step time and the min and max of the same windows."""
    found = _windows(store, "step_time", points)
    if found is None:
        return {}
    xs, windows = found
    return {
        "step_time_median": (xs, _median(windows)),
        "step_time_min": (xs, windows.min(axis=1)),
        "step_time_max": (xs, windows.max(axis=1)),
    }


def smoothed(store: Store, key: str, points: int = BAND_POINTS) -> tuple[FloatArray, ...] | None:
    """``key``'s rolling median over the windows of ``step_time_band`` (the smoothed line of a
    noisy rate: samples/s, tokens/s), as (x, y); None without values."""
    found = _windows(store, key, points)
    return None if found is None else (found[0], _median(found[1]))


def phase_stack(
    store: Store, points: int = PHASE_POINTS
) -> tuple[tuple[str, ...], FloatArray, FloatArray] | None:
    """The phases measured (names), the x of each bin (its last step) and a phases x bins
    matrix of mean seconds per step (0 where a phase was not measured); None without phases."""
    cols = store.columns
    present = [(name, key) for name, key in zip(PHASES, PHASE_KEYS, strict=True) if key in cols]
    if not present or "step" not in cols:
        return None
    columns = store.select(("step", *(key for _, key in present)))
    steps = columns["step"]
    matrix = np.vstack([columns[key] for _, key in present])
    rows = np.isfinite(matrix).any(axis=0) & np.isfinite(steps)
    steps, matrix = steps[rows], np.nan_to_num(matrix[:, rows], nan=0.0)
    n = steps.size
    if n == 0:
        return None
    # At most n bins over n rows: the edges are strictly increasing.
    edges = np.linspace(0, n, min(points, n) + 1).astype(np.int64)
    counts = np.diff(edges).astype(np.float64)
    sums = np.add.reduceat(matrix, edges[:-1], axis=1)
    return tuple(name for name, _ in present), steps[edges[1:] - 1], sums / counts


__all__ = ["phase_stack", "smoothed", "step_time_band"]
