"""Rules on the logged loss: non-finite values, spikes, plateaus. Subject: ``"loss"``."""

from __future__ import annotations

import math
import statistics

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.doc import SYMPTOM, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, never, no_alerts, nothing
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView
from nbmonitor.health.window import FloatArray, dense, finite_or_nan, row_medians, sustained
from nbmonitor.health.wording import num

# Robust spread (median absolute deviation scaled to a Gaussian sigma) a loss spike must also
# exceed, so that a loss with a tight noise band is judged by its noise, not only its level.
SPIKE_SIGMAS = 6.0
MAD_TO_SIGMA = 1.4826
# The first logged losses a spike is measured against before min_history losses are known.
EARLY_LOSSES = 3
# A loss that rose by more than this fraction over the plateau window is not on a plateau.
PLATEAU_RISE = 0.5
# Logged losses (the first ones seen) that set the starting level for the plateau rule.
START_LOSSES = 10


# A NaN is a logged one (not a step the loss was not logged on) after at least this many rows
# that all had it, before the reference window is long enough to call the column dense.
EARLY_LOGGED_ROWS = 3


def first_non_finite_row(view: HealthView, values: FloatArray) -> int | None:
    """First new row whose value is Inf, or a NaN that was logged: in a column logged every
    step so far (dense, or its first rows all there), or, at the run's first check, in a
    column that holds nothing but NaN (a column exists only once a row had the key)."""
    new = values[view.new_from :]
    bad = np.isinf(new)
    if dense(values[view.ref_from : view.new_from]):
        bad |= np.isnan(new)
    elif view.new_from == 0 and new.size and np.isnan(new).all():
        # The first check of the run, every loss NaN: the column exists only because rows had
        # the key, so the losses logged were NaN (a model broken from its first step).
        bad[0] = True
    else:
        # The first NaN of the window, after EARLY_LOGGED_ROWS rows that all had the key.
        gaps = np.flatnonzero(np.isnan(values[view.ref_from :]))
        first = view.ref_from + int(gaps[0]) if gaps.size else -1
        if first >= max(view.new_from, view.ref_from + EARLY_LOGGED_ROWS):
            bad[first - view.new_from] = True
    hits = np.flatnonzero(bad)
    return view.new_from + int(hits[0]) if hits.size else None


class NonFiniteLoss(Base):
    name = "loss_non_finite"
    doc = RuleDoc(
        SYMPTOM,
        "the logged loss is NaN or Inf",
        "the first non-finite value of the logged loss (NaN counts in a loss logged every step)",
        "lower the learning rate, clip gradients, and check the inputs and the loss for NaN, "
        "log(0) or division by zero",
        ("a loss logged only now and then (a missing value is not NaN)",),
    )

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        loss = view.column("loss")
        if loss is None or not view.has_new_rows:
            return nothing(rule)
        finite = np.isfinite(loss[view.new_from :])
        if finite.all():
            # Every new loss finite: none is the first non-finite one, and it is judged clear.
            return Outcome(rule, (), always, no_alerts)
        row = first_non_finite_row(view, loss)
        # Clear only on positive evidence: a finite loss among the new rows.
        seen_finite = bool(finite.any())
        judged = always if (row is not None or seen_finite) else never
        if row is None:
            return Outcome(rule, (), judged, lambda _new: [])
        step = float(view.step_col[row])
        value = float(loss[row])

        def make(_new: list[str]) -> list[Alert]:
            return [
                Alert(
                    rule,
                    "error",
                    f"Loss is {value} at step {int(step)}: training has diverged or the batch "
                    "has bad values. Lower the learning rate, clip gradients, check the inputs "
                    "and labels for NaN/Inf, and avoid log(0) or division by zero in the loss.",
                    int(step),
                    view.time_at(step),
                    subject=subjects.LOSS,
                )
            ]

        return Outcome(rule, ("",), judged, make)


class LossSpike(Base):
    name = "loss_spike"
    doc = RuleDoc(
        SYMPTOM,
        "the loss jumps far above its recent level",
        "the loss 5x or more above its recent median for 3 steps, beyond 6 robust sigmas of its "
        "noise and a tenth of the run's loss range",
        "lower the learning rate, add warm-up or clip gradients",
        (
            "noisy losses of small batches",
            "evaluation losses logged under another key",
            "schedules that restart",
        ),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        # The run's loss range: a spike must be a real share of how far the loss has travelled.
        self._lo = math.inf
        self._hi = -math.inf

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        loss = view.column("loss")
        if loss is None or not view.has_new_rows:
            return nothing(rule)
        # Work on the logged values only, so a loss logged every k steps is judged the same.
        rows = np.flatnonzero(np.isfinite(loss[view.ref_from :])) + view.ref_from
        values = loss[rows]
        first_new = int(np.searchsorted(rows, view.new_from))
        ref = values[max(0, first_new - t.window) : first_new]
        if first_new >= values.size:
            return nothing(rule)
        early = ref.size < t.min_history
        if early:
            # Early in the run: against the first losses, so that a loss that climbs far
            # above where it started (a learning rate far too high) is named at once.
            if view.ref_from > 0 or values.size < EARLY_LOSSES + t.sustain_steps:
                return nothing(rule)
            ref = values[:EARLY_LOSSES]
            first_new = max(first_new, EARLY_LOSSES)
        median = float(row_medians(ref[None, :])[0][0])
        # The windows judged start here (``sustained``); with fewer values than one window
        # from there, there is no level to judge.
        lo = max(0, first_new - (t.sustain_steps - 1))
        if values.size - lo < t.sustain_steps:
            return nothing(rule)
        old = values[:first_new]
        self._lo = min(self._lo, float(old.min()))
        self._hi = max(self._hi, float(old.max()))
        # Relative to |median| so that negative losses (log-likelihoods) work too, and beyond
        # a robust noise band. No window's level exceeds the largest value it holds: below
        # the first of the bars, none is a spike (the usual case, without the noise band and
        # the windows' minima).
        if not float(values[lo:].max()) - median > (t.spike_factor - 1) * abs(median):
            return clear(rule)
        mad = float(row_medians(np.abs(ref - median)[None, :])[0][0])
        level, where = sustained(values[None, :], first_new, t.sustain_steps)
        excess = float(level[0]) - median
        # A jump from 1e-4 to 1e-3 near convergence is noise, not a spike.
        span = self._hi - self._lo
        bar = max(
            (t.spike_factor - 1) * abs(median),
            SPIKE_SIGMAS * MAD_TO_SIGMA * mad,
            t.spike_range_fraction * span,
        )
        if not excess > bar:
            return clear(rule)
        # The spike starts at the first window held above the bar, not at its peak.
        first, _ = sustained(values[None, :], first_new, t.sustain_steps, above=median + bar)
        at = int(first[0]) if first[0] >= 0 else int(where[0])
        row = int(rows[at])
        step = float(view.step_col[row])
        value = float(level[0])

        def make(_new: list[str]) -> list[Alert]:
            what = "the first losses' median" if early else "the recent median"
            how = f"{num(value / median)}x {what}" if median > 0 else what
            return [
                Alert(
                    rule,
                    "warning",
                    f"Loss spiked to {num(value)} or more for {t.sustain_steps} steps from step "
                    f"{int(step)} ({how} {num(median)}). The learning rate may be at the edge of "
                    "stability (lower it, add warmup or clip gradients), or a run of bad "
                    "batches: check the data around that step.",
                    int(step),
                    view.time_at(step),
                    subject=subjects.LOSS,
                )
            ]

        return Outcome(rule, ("",), always, make)


class LossPlateau(Base):
    name = "loss_plateau"
    doc = RuleDoc(
        SYMPTOM,
        "the loss stopped falling far from where it could be",
        "no decrease over the last `plateau_window` (200) steps, having covered less than half the"
        " way from where it started",
        "try another learning rate; check that labels match inputs and the optimizer holds the "
        "model's parameters",
        (
            "a loss that flattens after falling a long way (converged)",
            "a loss overfitting one batch on purpose",
        ),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._start: list[float] = []

    def reset(self) -> None:
        self._start.clear()

    def _note_start(self, view: HealthView) -> None:
        """Keep the first few logged losses: the level progress is measured from."""
        if len(self._start) >= START_LOSSES:
            return
        loss = view.column("loss")
        if loss is None:
            return
        after = -math.inf if view.last_step is None else view.last_step
        fresh = loss[(view.step_col > after) & np.isfinite(loss)]
        self._start.extend(float(v) for v in fresh[: START_LOSSES - len(self._start)])

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        self._note_start(view)
        loss = view.column("loss")
        window = t.plateau_window
        if (
            loss is None
            or not view.has_new_rows
            or loss.size < window
            or len(self._start) < START_LOSSES
        ):
            return nothing(rule)
        recent = finite_or_nan(loss[-window:])
        quarter = window // 4
        first, last = recent[:quarter], recent[-quarter:]
        need = max(3, quarter // 4)  # sparse logging still gives a fair mean
        first_ok, last_ok = np.isfinite(first), np.isfinite(last)
        if first_ok.sum() < need or last_ok.sum() < need:
            return nothing(rule)
        before = float(first[first_ok].mean())
        after = float(last[last_ok].mean())
        # statistics, not numpy: np.median imports numpy.ma on first use (holding the GIL on
        # this thread, so stalling the training thread too).
        start = statistics.median(self._start)
        progress = (start - after) / abs(start) if start else math.inf
        # A loss that flattens after falling a long way has converged (or needs an LR decay);
        # the actionable case is a loss stuck near where it started.
        stuck = after >= before - t.plateau_tolerance * abs(before)
        # A loss that climbed is diverging (loss_spike names that), not on a plateau.
        stuck &= after <= before + PLATEAU_RISE * abs(before)
        if not (stuck and progress < t.plateau_progress):
            return clear(rule)
        step = float(view.step_col[-1])

        def make(_new: list[str]) -> list[Alert]:
            return [
                Alert(
                    rule,
                    "warning",
                    f"Loss has not decreased over the last {window} steps (mean {num(before)} "
                    f"-> {num(after)}; it started near {num(start)}) at step {int(step)}. Try "
                    "another learning rate, check that labels match inputs and that the "
                    "optimizer holds the model's parameters.",
                    int(step),
                    view.time_at(step),
                    subject=subjects.LOSS,
                )
            ]

        return Outcome(rule, ("",), always, make)


__all__ = ["LossPlateau", "LossSpike", "NonFiniteLoss"]
