"""Rules on where the time goes: a loop waiting for its data, an optimizer step that takes a
large share of the step, and a step time that has grown. Subject: ``"run"``.

They read the step phases (``phase_<name>_s``, ``attach(phases=True)``, the default) and
``step_time`` over the most recent steps; the median share of a phase, not one step, decides,
so one slow batch or a garbage collection does not alert.
"""

from __future__ import annotations

import math

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import View
from nbmonitor.health.window import FloatArray, row_medians

# Recent steps a share is judged over, and the fewest with a phase measured that it needs.
RECENT_STEPS = 50
MIN_STEPS = 10
# Input-bound: the wait for data is at least this share of each step, and this long (medians:
# in a toy loop on the CPU making a random batch is a fair share of a sub-millisecond step).
DATA_SHARE = 0.3
DATA_MIN_S = 0.001
# The optimizer step is at least this share of each step, and this long (medians).
OPTIMIZER_SHARE = 0.4
OPTIMIZER_MIN_S = 0.002
# A regression: the median of the recent steps at least this many times the fastest median
# of as many steps seen so far in the run, slower by at least REGRESSION_MIN_S, for at least
# REGRESSION_SUSTAIN_S of wall time (a shared machine slows a loop for seconds at a time).
REGRESSION_FACTOR = 1.5
REGRESSION_MIN_S = 0.02
REGRESSION_SUSTAIN_S = 30.0


def _median(values: FloatArray) -> float:
    return float(row_medians(values[None, :])[0][0])


def _recent_share(view: View, key: str) -> tuple[float, float, int] | None:
    """The median share of the step time spent in ``key`` over the recent steps, the median
    time spent in it, and the last step judged; None without enough of them."""
    phase, total = view.column(key), view.column("step_time")
    if phase is None or total is None or not view.has_new_rows:
        return None
    lo = max(0, phase.size - RECENT_STEPS)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = phase[lo:] / total[lo:]
    kept = np.isfinite(share)
    if kept.sum() < MIN_STEPS:
        return None
    return _median(share[kept]), _median(phase[lo:][kept]), int(view.step_col[-1])


class _ShareRule(Base):
    key = ""
    limit = 1.0  # share of the step
    least = 0.0  # seconds
    severity = "warning"

    def wording(self, share: float, step: int) -> str:
        raise NotImplementedError

    def check(self, view: View) -> Outcome:
        rule = self.name
        found = _recent_share(view, self.key)
        if found is None:
            return nothing(rule)
        share, seconds, step = found
        if share < self.limit or seconds < self.least:
            return clear(rule)

        def make(_new: list[str]) -> list[Alert]:
            text = self.wording(share, step)
            return [
                Alert(rule, self.severity, text, step, view.time_at(step), subject=subjects.RUN)
            ]

        return Outcome(rule, ("",), always, make)


class InputBound(_ShareRule):
    name = "input_bound"
    key = "phase_data_s"
    limit = DATA_SHARE
    least = DATA_MIN_S

    def wording(self, share: float, step: int) -> str:
        return (
            f"Input-bound: {share:.0%} of each step waits for data (median of the last "
            f"{RECENT_STEPS} steps, at step {step}). Load batches ahead: raise the DataLoader's "
            "num_workers, set pin_memory=True (and non_blocking=True in .to()), or move "
            "preprocessing out of the loop."
        )


class OptimizerShare(_ShareRule):
    name = "optimizer_share"
    key = "phase_optimizer_s"
    limit = OPTIMIZER_SHARE
    least = OPTIMIZER_MIN_S
    severity = "info"

    def wording(self, share: float, step: int) -> str:
        return (
            f"The optimizer takes {share:.0%} of the step (median of the last {RECENT_STEPS} "
            f"steps, at step {step}). A fused or foreach optimizer (e.g. "
            "torch.optim.AdamW(..., fused=True)) or larger batches spread its cost."
        )


class StepTimeRegression(Base):
    name = "step_time_regression"

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._best = math.inf  # the fastest median of RECENT_STEPS steps seen so far
        self._slow_since = math.nan  # wall time of the first check that found it slower

    def check(self, view: View) -> Outcome:
        rule = self.name
        times = view.column("step_time")
        if times is None or not view.has_new_rows:
            return nothing(rule)
        recent = times[max(0, times.size - RECENT_STEPS) :]
        recent = recent[np.isfinite(recent)]
        if recent.size < RECENT_STEPS:
            return nothing(rule)
        now = _median(recent)
        best = self._best
        self._best = min(best, now)
        if not (
            math.isfinite(best)
            and now >= REGRESSION_FACTOR * best
            and now - best >= REGRESSION_MIN_S
        ):
            self._slow_since = math.nan
            return clear(rule)
        if math.isnan(self._slow_since):
            self._slow_since = view.inp.time
        if view.inp.time - self._slow_since < REGRESSION_SUSTAIN_S:
            return nothing(rule)
        step = int(view.step_col[-1])

        def make(_new: list[str]) -> list[Alert]:
            return [
                Alert(
                    rule,
                    "warning",
                    f"Steps got slower: {now * 1e3:.3g} ms per step now (median of the last "
                    f"{RECENT_STEPS}, at step {step}) against {best * 1e3:.3g} ms earlier in "
                    "the run. Look at the timeline for the phase that grew; other processes "
                    "on the machine, a throttled GPU or growing inputs are common causes.",
                    step,
                    view.time_at(step),
                    subject=subjects.RUN,
                )
            ]

        return Outcome(rule, ("",), always, make)


__all__ = ["InputBound", "OptimizerShare", "StepTimeRegression"]
