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
    """When each rule fires. Defaults are chosen to stay silent on healthy training.

    Pass it, or a dict of some of its fields, as ``attach(..., thresholds=...)``; a value out
    of range raises ``ValueError`` at the call, in one line.

    >>> nbmonitor.Thresholds(explode_factor=20).explode_factor
    20
    >>> nbmonitor.Thresholds(window=0)
    Traceback (most recent call last):
    ...
    ValueError: Thresholds.window must be an int >= 1, got 0.

    Fields:
        explode_factor: exploding gradients: a layer's (or the total) gradient norm above this
            times its running median, and above the run's starting scale (docs/diagnosis.md).
        explode_abs: ... or above this absolute value (None: no absolute limit).
        grad_spike_factor: gradient spike: one step's total norm above this times the median
            of the steps before it.
        vanish_ratio: vanishing gradients: a layer's gradient norm / parameter norm below
            this ...
        vanish_steps: ... for this many consecutive recorded steps.
        update_ratio_high: update ratio ``||dw|| / ||w||`` above this: the learning rate is too
            high (healthy is about 1e-3).
        update_ratio_low: update ratio below this: the learning rate is too low, or the layer
            is not really training.
        spike_factor: loss spike: the loss above this times the median of the recent window
            ...
        spike_range_fraction: ... and up by this fraction of the run's loss range.
        plateau_window: plateau: the loss has not decreased over this many steps ...
        plateau_tolerance: ... by this relative decrease (last quarter against the first) ...
        plateau_progress: ... with less than this fraction of the way from the start
            covered.
        dead_fraction: dead units (``activations=True``): the fraction of exact zeros in a
            module's output at or above this.
        clip_fraction: clipping active: ``clip_grad_norm_`` scaled the gradients on this share
            of the last ``window`` steps ...
        clip_steps: ... judged once this many steps are known.
        skip_steps: GradScaler skipping: this many skipped steps among the last
            ``2 x skip_steps``.
        window: the recent steps in the running medians.
        min_history: the steps of reference before a median-based rule judges anything.
        rearm_steps: the steps a condition must stay clear before it can alert again.
        sustain_steps: the steps explosions, spikes and update ratios must last.
        stall_s: a distributed job: a rank that holds the others up (frozen or dead, left the
            job, or behind them in the step), or the whole job when every rank stopped at the
            same step and phase, is named once no rank has completed a step for this many
            seconds (and for 5 median step times).
        temperature_c: GPU temperature (degrees C) at or above which it alerts.
        memory_fraction: the fraction of device memory used at or above which it alerts.
        idle_util_percent: GPU utilisation below which the GPU counts as idle.
    """

    explode_factor: float = 10.0
    explode_abs: float | None = None
    grad_spike_factor: float = 20.0
    vanish_ratio: float = 1e-7
    vanish_steps: int = 20
    update_ratio_high: float = 1e-1
    update_ratio_low: float = 1e-6
    spike_factor: float = 5.0
    spike_range_fraction: float = 0.1
    plateau_window: int = 200
    plateau_tolerance: float = 0.01
    plateau_progress: float = 0.5
    dead_fraction: float = 0.99
    clip_fraction: float = 0.9
    clip_steps: int = 40
    skip_steps: int = 20
    window: int = 100
    min_history: int = 20
    rearm_steps: int = 100
    sustain_steps: int = 3
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
