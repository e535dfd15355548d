"""Progress: the estimated time left, from the recent step times."""

from __future__ import annotations

import math
import statistics

import numpy as np

from nbmonitor._engine.store import Store

ETA_STEPS = 50


def eta_seconds(steps: Store, step: int, total_steps: int | None) -> float:
    """Seconds left to ``total_steps`` at the median of the last step times (NaN: unknown)."""
    if not total_steps or "step_time" not in steps.columns:
        return math.nan
    recent = steps.tail("step_time", ETA_STEPS)
    recent = recent[np.isfinite(recent)]
    if not recent.size:
        return math.nan
    # statistics.median: np.median imports numpy.ma on first use (~20 ms).
    median: float = statistics.median(recent.tolist())
    return max(0, total_steps - step) * median
