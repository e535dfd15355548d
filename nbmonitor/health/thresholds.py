"""When each rule fires: ``Thresholds``, public as ``nbmonitor.Thresholds``, and its checks."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
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
    grad_spike_factor: float = 20.0  # one step's grad norm > factor x the recent median
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
    clip_fraction: float = 0.9  # clip_grad_norm_ scaled gradients on this share of steps ...
    clip_steps: int = 40  # ... of the last `window` steps, judged once this many are known
    skip_steps: int = 20  # the GradScaler skipped this many of the last 2 x skip_steps steps
    window: int = 100  # recent steps used by the running medians
    min_history: int = 20  # steps of reference before median-based rules judge anything
    rearm_steps: int = 100  # steps a condition must stay clear before it can alert again
    sustain_steps: int = 3  # explosions, spikes and update ratios must last this many steps
    # A rank of a distributed job that holds the others up is named once no rank has
    # completed a step for this many seconds (and for 5 median step times).
    stall_s: float = 30.0
    temperature_c: float = TEMPERATURE_C
    memory_fraction: float = MEMORY_FRACTION
    idle_util_percent: float = IDLE_UTIL_PERCENT

    def __post_init__(self) -> None:
        # Checked here, at the call, in one line each: a bad value would otherwise surface as
        # a comparison error inside a rule on the sampler thread, or never.
        for name in _POSITIVE:
            _check_real(name, getattr(self, name), lambda v: v > 0, "a finite number > 0")
        if self.explode_abs is not None:
            _check_real("explode_abs", self.explode_abs, lambda v: v > 0, "None or a number > 0")
        for name in _NON_NEGATIVE:
            _check_real(name, getattr(self, name), lambda v: v >= 0, "a finite number >= 0")
        for name in ("dead_fraction", "memory_fraction", "clip_fraction"):
            _check_real(name, getattr(self, name), lambda v: 0 < v <= 1, "a number in (0, 1]")
        _check_real(
            "idle_util_percent", self.idle_util_percent, lambda v: 0 <= v <= 100, "in [0, 100]"
        )
        for name in _COUNTS:
            _check_int(name, getattr(self, name), 1)
        _check_int("plateau_window", self.plateau_window, 8, " (it compares quarters)")
        _check_int("rearm_steps", self.rearm_steps, 0)


_POSITIVE = (
    "explode_factor",
    "grad_spike_factor",
    "vanish_ratio",
    "update_ratio_high",
    "update_ratio_low",
    "spike_factor",
    "temperature_c",
    "stall_s",
)
_NON_NEGATIVE = ("spike_range_fraction", "plateau_tolerance", "plateau_progress")
_COUNTS = ("vanish_steps", "window", "min_history", "sustain_steps", "clip_steps", "skip_steps")


def _check_real(name: str, value: object, ok: Callable[[float], bool], what: str) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or not ok(float(value))
    ):
        raise ValueError(f"Thresholds.{name} must be {what}, got {value!r}.")


def _check_int(name: str, value: object, least: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"Thresholds.{name} must be an int >= {least}{why}, got {value!r}.")


__all__ = ["IDLE_UTIL_PERCENT", "MEMORY_FRACTION", "TEMPERATURE_C", "Thresholds"]
