"""Causes judged from the learning rate and what it does to the weights: a schedule that
decayed the learning rate to nothing long before the run ends, a learning rate far too low to
move the weights, and one so high that the loss climbs while every layer moves far.

Each is judged from ratios the cause implies, not from one magnitude: the recorded lr against
its own peak, the update ratio ``||Δw||/||w||`` against what the lr and the gradient imply,
the loss against its own level before. Subject: ``"run"`` (the learning rate is the run's).
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.rules.updates import loss_falling, weight_rows
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView
from nbmonitor.health.window import FloatArray
from nbmonitor.health.wording import num

# The lr has collapsed when it is below this fraction of its own peak: three orders of
# magnitude, where a schedule meant to end near zero gets only in its last few percent.
COLLAPSED = 1e-3
# With the planned length known, a collapse before this share of it is far before the end: a
# schedule meant to end near zero (cosine, linear, OneCycle) is that low only in its last few
# percent.
EARLY_SHARE = 0.8

# The loss climbs when it holds at CLIMB x its level before the large updates for
# sustain_steps steps (or goes non-finite).
CLIMB = 2.0
# The losses whose median says the loss is still up, once the climb was named.
RECENT_LOSSES = 10
# An optimizer that follows its lr moves the weights at least this share of what plain SGD
# with that lr would (lr x ||g|| / ||w||): Adam moves them far more when gradients are small,
# SGD with momentum more too. An update far below it is damped by something else (Adam's eps,
# a scaler), not the lr.
FOLLOWS_LR = 0.1
# Far too small a step: a hundredth of a healthy one (||Δw||/||w|| about 1e-3).
TINY_STEP = 1e-5


def lr_column(view: HealthView) -> FloatArray | None:
    lr = view.column("lr")
    if lr is None or not np.isfinite(lr).any():
        return None
    return lr


class LrScheduleTooFast(Base):
    """The recorded lr fell below ``COLLAPSED`` x its peak and stayed there for
    ``min_history`` steps while the loss stopped falling, far before the run's end: before
    ``EARLY_SHARE`` of ``total_steps`` when the run said its length, else for longer than the
    schedule took to get there (a schedule that ends near zero ends the run there)."""

    name = "lr_schedule_too_fast"
    explains = ("loss_plateau", "update_ratio_low", "vanishing_gradients", "lr_too_low")
    doc = RuleDoc(
        CAUSE,
        "a schedule meant per epoch (StepLR, ExponentialLR, ...) is stepped every batch: the "
        "lr decays to nothing long before the run ends",
        "the recorded lr below 1e-3 x its peak for 20 steps, before 80 % of `total_steps` "
        "(or for longer than it took to get there), while the loss has stopped falling",
        "call `scheduler.step()` once per epoch, or size the schedule in batches "
        "(step_size, T_max, total_steps counted in optimizer steps)",
        (
            "cosine or linear decay to ~0 at the end of the run",
            "OneCycle",
            "warm-up",
            "warm restarts (SGDR)",
        ),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._peak = -math.inf
        self._peak_step = math.nan
        self._first = math.nan
        self._low_since = math.nan  # the step the lr fell below COLLAPSED x peak, while it stays

    def _never_low(self, lr: FloatArray, steps: FloatArray) -> bool:
        """Whether no new lr falls to ``COLLAPSED`` x the peak (the usual case); then the state
        is brought up to date as the step-by-step loop of ``check`` would, in a few calls for
        all the new rows (a slice of a fast loop holds thousands)."""
        finite = np.isfinite(lr)
        if not finite.all():
            lr, steps = lr[finite], steps[finite]
        if not lr.size:
            return True  # nothing to judge: the loop skips every row
        peaks = np.maximum.accumulate(np.concatenate(([self._peak], lr)))[1:]
        if (lr <= COLLAPSED * peaks).any():
            return False  # the loop, row by row
        if math.isnan(self._first):
            self._first = float(lr[0])
        top = int(np.argmax(lr))  # the first of the largest: a later equal one is not above it
        if lr[top] > self._peak:
            self._peak, self._peak_step = float(lr[top]), float(steps[top])
        self._low_since = math.nan
        return True

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        lr = lr_column(view)
        if lr is None or not view.has_new_rows:
            return nothing(rule)
        t = self.thresholds
        steps = view.step_col
        if self._never_low(lr[view.new_from :], steps[view.new_from :]):
            return clear(rule)
        found: tuple[float, float] | None = None  # (step, lr) where it holds
        for i in range(view.new_from, steps.size):
            value = float(lr[i])
            if not math.isfinite(value):
                continue
            if math.isnan(self._first):
                self._first = value
            if value > self._peak:
                self._peak, self._peak_step = value, float(steps[i])
            if not value <= COLLAPSED * self._peak:
                self._low_since = math.nan
                continue
            if math.isnan(self._low_since):
                self._low_since = float(steps[i])
            step = float(steps[i])
            low_for = step - self._low_since
            if low_for < t.min_history:
                continue
            total = view.inp.total_steps
            if total is not None:
                early = self._low_since <= EARLY_SHARE * total
            else:
                early = low_for >= max(t.window, self._low_since - self._peak_step)
            if early and not loss_falling(view, int(step)):
                found = (step, value)
                break
        if found is None:
            return clear(rule)
        step, now = found
        first, peak, since = self._first, self._peak, self._low_since
        total = view.inp.total_steps

        def make(_new: list[str]) -> list[Alert]:
            when = f"by step {int(since)}" + (f" of {total}" if total is not None else "")
            return [
                cause_alert(
                    rule,
                    cause="The learning-rate schedule decays far too fast: a schedule meant per "
                    "epoch is probably stepped every batch, so the lr is nearly 0 long before "
                    "the run ends and training has stopped",
                    said=f"lr {num(peak)} at its peak, {num(now)} {when}, {num(now / peak)} of "
                    "its peak; the loss no longer falls",
                    evidence={
                        "lr_start": first,
                        "lr_peak": peak,
                        "lr_now": now,
                        "peak_step": int(self._peak_step),
                        "collapsed_step": int(since),
                        "step": int(step),
                        "total_steps": total,
                    },
                    fix="call scheduler.step() once per epoch, not every batch, or size the "
                    "schedule in optimizer steps (step_size, T_max, total_steps)",
                    step=int(step),
                    time=view.time_at(step),
                    subject=subjects.RUN,
                )
            ]

        return Outcome(rule, ("",), always, make)


class _Ratios:
    """The measured update ratios of the weight layers (biases left out: they often start at
    zero), step by step, each seen once."""

    def __init__(self) -> None:
        self.last_seen = -math.inf

    def new(self, view: HealthView) -> list[tuple[int, FloatArray]]:
        inp = view.inp
        steps, series = inp.update_steps, inp.update_series
        if (
            steps is None
            or series is None
            or series.shape != (len(view.layer_names), steps.size)
            or not len(view.layer_names)
        ):
            return []
        weights = weight_rows(view.layer_names)
        fresh = np.flatnonzero(steps > self.last_seen)
        if fresh.size:
            self.last_seen = float(steps[fresh[-1]])
        return [(int(steps[i]), np.asarray(series[weights, i], dtype=np.float64)) for i in fresh]


def _median(values: FloatArray) -> float:
    finite = values[np.isfinite(values)]
    return float(statistics.median(finite.tolist())) if finite.size else math.nan


class LrTooHigh(Base):
    """A measured step whose median weight layer moved more than ``update_ratio_high`` of its
    norm (a hundred times a healthy step) and, within ``window`` steps after it, a loss held at
    ``CLIMB`` x its level before those updates for ``sustain_steps`` steps, or not finite."""

    name = "lr_too_high"
    explains = (
        "loss_spike",
        "loss_non_finite",
        "grad_non_finite",
        "update_ratio_high",
        "exploding_gradients",
        "gradient_spike",
        "clipping_active",
        "loss_plateau",
        "vanishing_gradients",
    )
    doc = RuleDoc(
        CAUSE,
        "the learning rate is far too high: each step moves the weights by a large share of "
        "their size and the loss climbs or goes NaN",
        "the median weight layer's `‖Δw‖/‖w‖` above 0.1 (healthy is about 1e-3) on a measured "
        "step, then the loss at 2x its level before for 3 steps, or not finite",
        "lower the learning rate (10x at a time), or add a warm-up",
        ("SGD momentum building up", "large early updates while the loss falls", "LoRA B at 0"),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._ratios = _Ratios()
        # The first step with large updates: (step, median ratio, largest ratio, loss before).
        self._large: tuple[int, float, float, float] | None = None
        self._named = False  # it held: the episode lasts while the loss stays up

    def _level_before(self, view: HealthView, step: int) -> float:
        loss = view.column("loss")
        if loss is None:
            return math.nan
        # A step's loss is computed before its update: the level before the update of ``step``
        # is the losses up to and including it.
        end = int(np.searchsorted(view.step_col, step, side="right"))
        before = loss[max(0, end - self.thresholds.window) : end]
        before = before[np.isfinite(before)]
        return _median(before) if before.size else math.nan

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        found = False
        for measured, ratios in self._ratios.new(view):
            middle = _median(ratios)
            if self._large is None and middle > t.update_ratio_high:
                largest = float(np.nanmax(ratios))
                self._large = (measured, middle, largest, self._level_before(view, measured))
                found = True
        loss = view.column("loss")
        # A large update found now is judged now, new rows or not: its ratios can come in a
        # check after the last steps' rows (the layer samples a tick late, or at close).
        if self._large is None or loss is None or not (view.has_new_rows or found):
            return nothing(rule)
        at, middle, largest, before = self._large
        if not math.isfinite(before) or before <= 0:
            return nothing(rule)
        steps = view.step_col
        if self._named:
            # The episode lasts while the loss stays up (the symptoms it explains meanwhile
            # are its own): it ends once the recent losses fall back below CLIMB x before.
            recent = loss[view.new_from :]
            recent = recent[np.isfinite(recent)][-RECENT_LOSSES:]
            if recent.size and _median(recent) < CLIMB * before:
                return clear(rule)
            return Outcome(rule, ("",), always, lambda _new: [])
        # The whole window after the large update, not only this tick's new rows: the update
        # ratios come from the layer samples, which can reach the check a tick after the steps
        # that followed them (a loaded machine), and those steps must still be judged.
        lo = int(np.searchsorted(steps, at, side="left"))
        hi = int(np.searchsorted(steps, at + t.window, side="right"))
        if lo >= hi:
            return clear(rule) if steps[-1] > at + t.window else nothing(rule)
        seg = loss[lo:hi]
        m = t.sustain_steps
        bad = ~np.isfinite(seg) & ~np.isnan(seg)  # Inf
        if seg.size >= m:
            held = np.lib.stride_tricks.sliding_window_view(seg, m)
            with np.errstate(invalid="ignore"):
                climbs = (held >= CLIMB * before).all(axis=1)
        else:
            climbs = np.zeros(0, dtype=bool)
        hits = np.flatnonzero(bad)
        first_climb = np.flatnonzero(climbs)
        rows = [int(h) for h in (hits[:1].tolist() + first_climb[:1].tolist())]
        if not rows:
            return clear(rule)
        row = lo + min(rows)
        step = float(steps[row])
        peak = seg[np.isfinite(seg)]
        worst = float(peak.max()) if peak.size else math.inf
        lr = lr_column(view)
        lr_now = float(lr[row]) if lr is not None else math.nan
        self._named = True

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    rule,
                    cause="The learning rate is far too high: every step moves the weights by "
                    "a large share of their size, and the loss climbs instead of falling",
                    said=f"||Δw||/||w|| {num(middle)} in the median layer (up to {num(largest)}"
                    f"; healthy is about 1e-3) at step {at}, then the loss {num(before)} -> "
                    f"{num(worst)} by step {int(step)}"
                    + (f", lr {num(lr_now)}" if math.isfinite(lr_now) else ""),
                    evidence={
                        "update_ratio_median": middle,
                        "update_ratio_max": largest,
                        "update_step": at,
                        "loss_before": before,
                        "loss_peak": worst,
                        "step": int(step),
                        "lr": lr_now if math.isfinite(lr_now) else None,
                    },
                    fix="lower the learning rate (10x at a time until the loss falls), or add a "
                    "warm-up",
                    step=int(step),
                    time=view.time_at(step),
                    subject=subjects.RUN,
                )
            ]

        return Outcome(rule, ("",), always, make)


class LrTooLow(Base):
    """The median weight layer moved less than ``TINY_STEP`` of its norm on
    ``sustain_steps`` measured steps in a row (from ``min_history`` on) while its gradient is
    finite and not zero, the step follows the lr (at least ``FOLLOWS_LR`` of what plain SGD
    with it would move), the lr is not a schedule's decayed end, and the loss is not
    falling."""

    name = "lr_too_low"
    explains = ("update_ratio_low", "loss_plateau")
    doc = RuleDoc(
        CAUSE,
        "the learning rate is far too small to move the weights",
        "the median weight layer's `‖Δw‖/‖w‖` below 1e-5 on 3 measured steps (healthy is about "
        "1e-3) with gradients that are not zero, an update that follows the lr, and a loss "
        "that does not fall",
        "raise the learning rate (Adam: 1e-4 to 1e-3 is usual; SGD: 1e-2 to 1e-1)",
        ("the end of a decay schedule", "frozen parameters", "Adam with a huge eps (not the lr)"),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._ratios = _Ratios()
        self._streak = 0
        self._lr_peak = 0.0
        self._found: tuple[int, float, float, float] | None = None
        self._layers: list[str] = []  # the weight layers whose steps were that small

    def _follows_lr(self, view: HealthView, step: int, lr: float, ratios: FloatArray) -> bool:
        """Whether the update is at least FOLLOWS_LR of lr x ||g|| / ||w|| in the median
        weight layer (unknown: it is not judged)."""
        grads, series = view.grads, view.inp.param_series
        steps = view.inp.update_steps
        if grads is None or series is None or steps is None or not view.layer_step_col.size:
            return False
        j = int(np.searchsorted(view.layer_step_col, step))
        i = int(np.searchsorted(steps, step))
        if j >= view.layer_step_col.size or view.layer_step_col[j] != step or i >= steps.size:
            return False
        weights = weight_rows(view.layer_names)
        with np.errstate(divide="ignore", invalid="ignore"):
            sgd = lr * grads[weights, j] / series[weights, i]
            share = ratios / sgd
        middle = _median(share)
        return math.isfinite(middle) and middle >= FOLLOWS_LR

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        seen = self._ratios.new(view)
        lr = lr_column(view)
        if not seen or lr is None:
            return nothing(rule)
        finite = lr[np.isfinite(lr)]
        top = float(finite.max()) if finite.size else 0.0  # the same for every measured step
        for step, ratios in seen:
            row = int(np.searchsorted(view.step_col, step, side="right")) - 1
            here = float(lr[row]) if row >= 0 else math.nan
            self._lr_peak = max(self._lr_peak, top)
            if step < t.min_history or not math.isfinite(here):
                continue
            middle = _median(np.where(ratios > 0, ratios, np.nan))
            tiny = (
                middle < TINY_STEP
                and here > 0
                and here >= 0.01 * self._lr_peak  # not a schedule's decayed end
                and self._follows_lr(view, step, here, ratios)
            )
            self._streak = self._streak + 1 if tiny else 0
            done = self._streak >= t.sustain_steps and self._found is None
            if done and not loss_falling(view, step):
                self._found = (step, middle, here, float(np.nanmin(ratios)))
                rows = weight_rows(view.layer_names).tolist()
                names = [n for n, w in zip(view.layer_names, rows, strict=True) if w]
                small = zip(names, ratios.tolist(), strict=True)
                self._layers = [n for n, r in small if 0 < r < TINY_STEP]
        if self._found is None:
            return clear(rule)
        step, middle, here, least = self._found

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    rule,
                    cause="The learning rate is far too small: the optimizer's steps barely "
                    "move the weights, so the model does not learn",
                    said=f"lr {num(here)}; ||Δw||/||w|| {num(middle)} in the median layer "
                    f"(healthy is about 1e-3) for {t.sustain_steps} measured steps by step "
                    f"{step}, while the gradients are not zero and the loss does not fall",
                    evidence={
                        "lr": here,
                        "update_ratio_median": middle,
                        "update_ratio_min": least,
                        "step": step,
                    },
                    fix="raise the learning rate (Adam: 1e-4 to 1e-3 is usual; SGD: 1e-2 to 1e-1)",
                    layers=self._layers,
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(rule, ("",), always, make)


__all__ = ["LrScheduleTooFast", "LrTooHigh", "LrTooLow"]
