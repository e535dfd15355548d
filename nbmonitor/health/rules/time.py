"""Rules on where the time goes: a loop waiting for its data, an optimizer step that takes
most of the step when a faster implementation is at hand, and a step time that has grown.
Subject: ``"run"``.

They read the step phases (``phase_<name>_s``, ``attach(phases=True)``, the default) and
``step_time`` over the most recent steps, and judge against the run's own noise:

- Another process competing for the machine only ever adds time, to whichever phase it
  interrupts. So a phase's share is read in the fastest quarter of the recent steps, those
  nothing interrupted: the share of their time spent in the phase. One slow batch, a garbage
  collection or a busy neighbour (on fewer than three steps in four) moves it little.
- The monitor's own work is not the loop's: a step that overlapped one of the sampler's busy
  spells (``HealthInput.monitor_busy``) waited for the interpreter wherever it ran Python (a
  for-loop optimizer most), so the shares are read from the steps that ran apart from them.
- A verdict must persist: it holds on every check over ``PERSIST_STEPS`` steps before it is
  said (a check that finds it clear starts the count again).
- The optimizer rule speaks only when it has something to suggest that the run does not
  already use (``HealthInput.optimizer``: fused, then foreach); without that, it is silent.
"""

from __future__ import annotations

import math

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.doc import FINDING, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView
from nbmonitor.health.window import BoolArray, FloatArray
from nbmonitor.records import OptimizerRecord

# Recent steps a share is judged over, and the fewest with a phase measured that it needs;
# they are the last steps that ran apart from the monitor's own work, within LOOK_BACK steps.
RECENT_STEPS = 50
MIN_STEPS = 10
LOOK_BACK = 4 * RECENT_STEPS
# The fastest fraction of the recent steps a share is read in (see above); the lower quartile
# of the step times is also what a regression judges.
QUANTILE = 0.25
# Steps a share verdict must keep holding, from the first check that found it, before it is
# said (with RECENT_STEPS, it covers three windows' worth of steps).
PERSIST_STEPS = 100
# Input-bound: the wait for data is at least this share of the step, and this long (in the
# fastest steps: in a toy loop on the CPU making a random batch is a fair share of a
# sub-millisecond step).
DATA_SHARE = 0.3
DATA_MIN_S = 0.001
# The optimizer step is at least this share of the step (longer than the rest of the step
# together: a fused or foreach step, a fraction of a for-loop one, would make the whole step
# markedly faster), and this long (in the fastest steps).
OPTIMIZER_SHARE = 0.5
OPTIMIZER_MIN_S = 0.002
# A regression: the lower quartile of the recent step times (even the fast steps are slower)
# at least this many times the fastest median of as many steps seen so far in the run, slower
# by at least REGRESSION_MIN_S, for at least REGRESSION_SUSTAIN_S of wall time (a shared
# machine slows a loop for seconds at a time).
REGRESSION_FACTOR = 1.5
REGRESSION_MIN_S = 0.02
REGRESSION_SUSTAIN_S = 30.0


def _quantile(values: FloatArray, q: float) -> float:
    """``np.quantile(values, q)`` (linear interpolation), written out: np.quantile imports
    numpy.ma the first time, a stall of the training loop (tests/test_monitor.py)."""
    if not values.size:
        return math.nan
    ordered = np.sort(values)
    at = q * (ordered.size - 1)
    lo = math.floor(at)
    hi = min(lo + 1, ordered.size - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo))


def _apart_from_monitor(view: HealthView, total: FloatArray) -> BoolArray:
    """Which of the last ``total.size`` steps ran while the monitor's sampler was idle: a step
    that overlapped one of its busy spells (``HealthInput.monitor_busy``) waited for the
    interpreter in its Python-bound phases, the monitor's time and not the loop's."""
    spells = view.inp.monitor_busy
    ends = view.column("time")
    if not spells or ends is None:
        return np.ones(total.size, dtype=bool)
    end = ends[ends.size - total.size :]
    start = end - total
    lo, hi = np.array(spells, dtype=np.float64).T
    if (lo[1:] >= lo[:-1]).all() and (hi[1:] >= hi[:-1]).all():
        # The sampler's spells one after another (both ends in order): of the spells that end
        # after a step starts, the first also starts first, so the step overlaps one of them
        # if and only if it overlaps that one (a search a step, not a comparison a spell).
        first = np.searchsorted(hi, start, side="right")
        after: BoolArray = lo[np.minimum(first, lo.size - 1)] < end
        overlaps: BoolArray = (first < lo.size) & after
        return ~overlaps
    # Spells in another order: every spell against every step at once.
    apart: BoolArray = ~((start < hi[:, None]) & (end > lo[:, None])).any(axis=0)
    return apart


def _recent(view: HealthView) -> tuple[FloatArray, BoolArray, int] | None:
    """The recent step times (the last ``LOOK_BACK``), which of them are kept (finite,
    positive, apart from the monitor's work), and where they start in the columns: what the
    share rules read alike, made once a check (``HealthView.shared``)."""
    total = view.column("step_time")
    if total is None:
        return None
    lo = max(0, total.size - LOOK_BACK)
    total = total[lo:]
    kept = np.isfinite(total) & (total > 0)
    kept &= _apart_from_monitor(view, total)
    return total, kept, lo


def _recent_share(view: HealthView, key: str) -> tuple[float, float, int] | None:
    """The share of the step spent in ``key`` in the fastest quarter of the recent steps that
    ran apart from the monitor's own work (up to ``RECENT_STEPS`` of them, in the last
    ``LOOK_BACK`` steps), the mean time spent in it there, and the last step judged; None
    without enough steps."""
    phase = view.column(key)
    if phase is None or not view.has_new_rows:
        return None
    recent = view.shared("recent step times", lambda: _recent(view))
    if recent is None:
        return None
    total, kept, lo = recent
    phase = phase[lo:]
    index = np.flatnonzero(kept & np.isfinite(phase))[-RECENT_STEPS:]
    if index.size < MIN_STEPS:
        return None
    phase, total = phase[index], total[index]
    fast = total <= _quantile(total, QUANTILE)
    share = min(1.0, float(phase[fast].sum() / total[fast].sum()))
    return share, float(phase[fast].mean()), int(view.step_col[-1])


def optimizer_suggestion(optimizer: OptimizerRecord | None) -> str | None:
    """What would make ``optimizer``'s step faster that the run does not already use: the
    argument to pass, or None (already fused, no faster implementation, or not known)."""
    if optimizer is None or optimizer.implementation in ("fused", "unknown"):
        return None
    if optimizer.can_fuse:
        return "fused=True"
    if optimizer.implementation == "for-loop" and optimizer.can_foreach:
        return "foreach=True"
    return None


class _ShareRule(Base):
    key = ""
    limit = 1.0  # share of the step
    least = 0.0  # seconds
    severity = "warning"

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._since = math.nan  # the step of the first check of the current streak that held

    def wording(self, view: HealthView, share: float, step: int) -> str:
        raise NotImplementedError

    def applies(self, view: HealthView) -> bool:
        """Whether the rule has anything to say to this run at all."""
        return True

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        if math.isnan(self._since) and not self.applies(view):
            # It cannot hold (nothing to suggest to this run) and no streak runs: the share is
            # measured only if what it judged is asked (``Outcome.judged``: an episode open).
            def judged(_: str) -> bool:
                return _recent_share(view, self.key) is not None

            return Outcome(rule, (), judged, lambda _new: [])
        found = _recent_share(view, self.key)
        if found is None:
            return nothing(rule)
        share, seconds, step = found
        if not (share >= self.limit and seconds >= self.least and self.applies(view)):
            self._since = math.nan
            return clear(rule)
        if math.isnan(self._since) or step < self._since:
            self._since = step
        if step - self._since < PERSIST_STEPS:
            return nothing(rule)

        def make(_new: list[str]) -> list[Alert]:
            text = self.wording(view, share, step)
            return [
                Alert(rule, self.severity, text, step, view.time_at(step), subject=subjects.RUN)
            ]

        return Outcome(rule, ("",), always, make)


class InputBound(_ShareRule):
    name = "input_bound"
    doc = RuleDoc(
        FINDING,
        "the loop waits for its data",
        "the data phase is 30 % or more of the fastest quarter of the last 50 steps and at least 1"
        " ms, held over 100 steps",
        "load batches ahead: `DataLoader(num_workers=..., pin_memory=True)` and `.to(device, "
        "non_blocking=True)`",
        ("a busy neighbour process", "a slow first step"),
    )
    key = "phase_data_s"
    limit = DATA_SHARE
    least = DATA_MIN_S

    def wording(self, view: HealthView, share: float, step: int) -> str:
        return (
            f"Input-bound: {share:.0%} of each step waits for data (over the last "
            f"{RECENT_STEPS} steps, at step {step}). Load batches ahead: raise the DataLoader's "
            "num_workers, set pin_memory=True (and non_blocking=True in .to()), or move "
            "preprocessing out of the loop."
        )


class OptimizerShare(_ShareRule):
    name = "optimizer_share"
    doc = RuleDoc(
        FINDING,
        "the optimizer step takes half the step while a faster implementation is at hand",
        "the optimizer phase 50 % or more of the fast steps and at least 2 ms, and `fused=True` or"
        " `foreach=True` available but unused",
        "`fused=True` (or `foreach=True`) in the optimizer",
        ("an optimizer already fused", "another library's optimizer"),
    )
    key = "phase_optimizer_s"
    limit = OPTIMIZER_SHARE
    least = OPTIMIZER_MIN_S
    severity = "info"

    def applies(self, view: HealthView) -> bool:
        return optimizer_suggestion(view.inp.optimizer) is not None

    def wording(self, view: HealthView, share: float, step: int) -> str:
        optimizer = view.inp.optimizer
        suggestion = optimizer_suggestion(optimizer)
        assert optimizer is not None and suggestion is not None  # applies() held
        now = _NOW.get(optimizer.implementation, "")
        return (
            f"The optimizer takes {share:.0%} of the step (over the last {RECENT_STEPS} "
            f"steps, at step {step}): {optimizer.name} {now}. "
            f"torch.optim.{optimizer.name}(..., {suggestion}) {_BETTER[suggestion]}, for a "
            "markedly faster step."
        )


# What the optimizer does now, and what the suggestion does instead, for the message.
_NOW = {
    "for-loop": "updates its tensors one by one in a Python loop",
    "foreach": "runs its foreach implementation",
}
_BETTER = {
    "fused=True": "updates them all in one fused kernel",
    "foreach=True": "updates them in a few batched calls",
}


class StepTimeRegression(Base):
    name = "step_time_regression"
    doc = RuleDoc(
        FINDING,
        "steps became much slower than earlier in the run",
        "the lower quartile of the last 50 step times 1.5x or more the fastest median seen, at "
        "least 20 ms slower, for 30 s or more",
        "see which phase grew in the timeline; other processes, a throttled GPU or growing inputs "
        "are common causes",
        ("evaluation passes", "a loaded machine for a moment"),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._best = math.inf  # the fastest median of RECENT_STEPS steps seen so far
        self._slow_since = math.nan  # wall time of the first check that found it slower

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        times = view.column("step_time")
        if times is None or not view.has_new_rows:
            return nothing(rule)
        recent = times[max(0, times.size - RECENT_STEPS) :]
        recent = recent[np.isfinite(recent)]
        if recent.size < RECENT_STEPS:
            return nothing(rule)
        median = _quantile(recent, 0.5)
        floor = _quantile(recent, QUANTILE)
        best = self._best
        self._best = min(best, median)
        if not (
            math.isfinite(best)
            and floor >= REGRESSION_FACTOR * best
            and floor - best >= REGRESSION_MIN_S
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
                    f"Steps got slower: {median * 1e3:.3g} ms per step now (median of the last "
                    f"{RECENT_STEPS}, at step {step}) against {best * 1e3:.3g} ms earlier in "
                    "the run. Look at the timeline for the phase that grew; other processes "
                    "on the machine, a throttled GPU or growing inputs are common causes.",
                    step,
                    view.time_at(step),
                    subject=subjects.RUN,
                )
            ]

        return Outcome(rule, ("",), always, make)


__all__ = [
    "InputBound",
    "OptimizerShare",
    "StepTimeRegression",
    "optimizer_suggestion",
]
