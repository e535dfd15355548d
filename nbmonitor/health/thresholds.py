"""When each rule fires: ``Thresholds``, public as ``nbmonitor.Thresholds``, and its checks."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Device defaults, also the defaults of the device rule functions used on their own.
TEMPERATURE_C = 85.0
MEMORY_FRACTION = 0.95
IDLE_UTIL_PERCENT = 30.0


@dataclass(frozen=True)
class Thresholds:
    """When each rule fires. Defaults are chosen to stay silent on healthy training."""

    explode_factor: float = 10.0  # layer (or total) grad norm > factor x its running median
    explode_abs: float | None = None  # or above this absolute value
    vanish_ratio: float = 1e-7  # layer grad norm / param norm below this ...
    vanish_steps: int = 20  # ... for this many consecutive recorded steps
    update_ratio_high: float = 1e-1  # ||dw||/||w|| above this: LR too high (healthy ~1e-3)
    update_ratio_low: float = 1e-6  # below this: LR too low, or not really training
    spike_factor: float = 5.0  # loss > factor x the median of the recent window
    spike_range_fraction: float = 0.1  # ... and up by this fraction of the run's loss range
    plateau_window: int = 200  # loss not decreasing over this many steps
    plateau_tolerance: float = 0.01  # relative decrease (last vs first quarter) that counts
    plateau_progress: float = 0.5  # ... and improved by less than this fraction since the start
    dead_fraction: float = 0.99  # activations: fraction of exact zeros at or above this
    window: int = 100  # recent steps used by the running medians
    min_history: int = 20  # steps of reference before median-based rules judge anything
    rearm_steps: int = 100  # steps a condition must stay clear before it can alert again
    sustain_steps: int = 3  # explosions, spikes and update ratios must last this many steps
    temperature_c: float = TEMPERATURE_C
    memory_fraction: float = MEMORY_FRACTION
    idle_util_percent: float = IDLE_UTIL_PERCENT

    def __post_init__(self) -> None:
        positive = {
            "explode_factor": self.explode_factor,
            "vanish_ratio": self.vanish_ratio,
            "update_ratio_high": self.update_ratio_high,
            "update_ratio_low": self.update_ratio_low,
            "spike_factor": self.spike_factor,
        }
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Thresholds.{name} must be a finite number > 0, got {value!r}.")
        counts = {
            "vanish_steps": self.vanish_steps,
            "plateau_window": self.plateau_window,
            "window": self.window,
            "min_history": self.min_history,
            "sustain_steps": self.sustain_steps,
        }
        for name, count in counts.items():
            if count < 1:
                raise ValueError(f"Thresholds.{name} must be at least 1, got {count!r}.")
        if self.plateau_window < 8:
            raise ValueError(
                f"Thresholds.plateau_window must be at least 8 (it compares quarters), "
                f"got {self.plateau_window!r}."
            )
        if self.rearm_steps < 0:
            raise ValueError(f"Thresholds.rearm_steps must be >= 0, got {self.rearm_steps!r}.")
        if not 0 < self.dead_fraction <= 1:
            raise ValueError(
                f"Thresholds.dead_fraction must be in (0, 1], got {self.dead_fraction!r}."
            )


__all__ = ["IDLE_UTIL_PERCENT", "MEMORY_FRACTION", "TEMPERATURE_C", "Thresholds"]
