"""Rules on update ratios ||Δw||/||w||: too large (learning rate too high) or too small.
Subject: ``"layers"``.

Ratios are measured on some steps only (every step early in a run, then every
``layer_every`` steps): each measured step is one observation, in step order
(``HealthInput.update_series``; without it, a changed ``update_ratios`` array), and a rule
holds for a layer after ``sustain_steps`` observations in a row: one noisy update raises
nothing.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.doc import SYMPTOM, RuleDoc
from nbmonitor.health.rule import Base, Outcome, no_alerts, nothing
from nbmonitor.health.rules.gradients import cancelled_biases
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView
from nbmonitor.health.window import BoolArray, FloatArray, IntArray
from nbmonitor.health.wording import HEALTHY_UPDATE, layer_list, num


class _UpdateRatio(Base):
    """A streak of observations beyond a limit, per layer; subclasses say which layers are
    judged, which side of the limit is bad, and how to word it."""

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._names: tuple[str, ...] | None = None
        self._prev: FloatArray | None = None
        self._last_seen = -np.inf  # step of the newest observation judged
        self._streak = np.zeros(0, dtype=np.intp)

    def _judged(self, view: HealthView, ratios: FloatArray, step: int) -> BoolArray:
        raise NotImplementedError

    def _beyond(self, ratios: FloatArray) -> BoolArray:
        raise NotImplementedError

    def _extreme(self, values: list[float]) -> float:
        raise NotImplementedError

    def _message(self, names: str, extreme: float, step: int) -> str:
        raise NotImplementedError

    def _possible(self, view: HealthView, ratios: FloatArray) -> BoolArray:
        """Where ``ratios`` (layers x measured steps) could be judged beyond the limit: a
        superset of ``_judged & _beyond`` that reads the ratios alone."""
        raise NotImplementedError

    def _note(self, view: HealthView, step: int) -> None:
        """What ``_judged`` keeps of a measured step beyond its verdict (run-wide state)."""

    def _observations(self, view: HealthView) -> tuple[list[int], FloatArray]:
        """The new measured steps and their ratios (layers x steps), oldest first."""
        inp = view.inp
        steps, series = inp.update_steps, inp.update_series
        if (
            steps is not None
            and series is not None
            and series.shape
            == (
                len(view.layer_names),
                steps.size,
            )
        ):
            at = np.flatnonzero(steps > self._last_seen)
            if not at.size:
                return [], np.empty((len(view.layer_names), 0))
            self._last_seen = float(steps[at[-1]])
            return [int(x) for x in steps[at].tolist()], np.asarray(series[:, at], dtype=np.float64)
        given = inp.update_ratios
        if given is None or given.shape != (len(view.layer_names),):
            return [], np.empty((len(view.layer_names), 0))
        ratios = np.asarray(given, dtype=np.float64)
        if self._prev is not None and np.array_equal(ratios, self._prev, equal_nan=True):
            return [], np.empty((len(view.layer_names), 0))
        self._prev = ratios.copy()
        return [inp.step], ratios[:, None]

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        names = view.layer_names
        if self._names != names:
            self._names = names
            self._prev = None
            self._streak = np.zeros(len(names), dtype=np.intp)
        seen, block = self._observations(view)
        if not seen:
            return nothing(rule)
        # The first steps move far by design (Adam's first update is lr per weight;
        # zero-initialised parts start from nothing): judged from min_history on.
        late = [k for k, step in enumerate(seen) if step >= t.min_history]
        if late and not self._possible(view, block[:, late[0] :]).any():
            # No layer can be beyond the limit on any new measured step: every streak ends,
            # none holds, and the last step's verdict (which layers were judged) is worked
            # out only if asked (an episode of the rule open).
            self._streak = np.zeros_like(self._streak)
            last, ratios = seen[late[-1]], block[:, late[-1]]
            self._note(view, last)
            verdict: list[Callable[[str], bool]] = []

            def judged_late(subject: str) -> bool:
                if not verdict:
                    verdict.append(view.layer_judged(self._judged(view, ratios, last)))
                return verdict[0](subject)

            return Outcome(rule, (), judged_late, no_alerts, spreads=True)
        judged = np.zeros(len(names), dtype=bool)
        # subject -> (step it started to hold, ratio then)
        found: dict[str, tuple[int, float]] = {}
        for k in late:
            step, ratios = seen[k], block[:, k]
            judged = self._judged(view, ratios, step)
            self._streak = np.where(judged & self._beyond(ratios), self._streak + 1, 0)
            for i in np.flatnonzero(self._streak >= t.sustain_steps):
                found.setdefault(names[i], (step, float(ratios[i])))
        held = list(found)

        def make(new: list[str]) -> list[Alert]:
            step = min(found[name][0] for name in new)
            extreme = self._extreme([found[name][1] for name in new])
            return [
                Alert(
                    rule,
                    "warning",
                    self._message(layer_list(new, view.inp.module_kinds), extreme, step),
                    step,
                    view.time_at(step),
                    tuple(new),
                    subject=subjects.LAYERS,
                )
            ]

        return Outcome(rule, held, view.layer_judged(judged), make, spreads=True)


# A learning rate below this fraction of the run's largest is a schedule's decay, not a bug.
DECAYED_LR = 0.01


# The loss is falling when the median of its last RECENT_LOSS values is below FALLING x the
# median of the (up to EARLIER_LOSS, at least RECENT_LOSS) values before them.
RECENT_LOSS = 10
EARLIER_LOSS = 30
FALLING = 0.9


def loss_falling(view: HealthView, step: int) -> bool:
    loss = view.column("loss")
    if loss is None:
        return False
    end = int(np.searchsorted(view.step_col, step, side="right"))
    want = RECENT_LOSS + EARLIER_LOSS
    # The newest `want` finite losses up to `step`: looked for among the rows just before it
    # first (a loss logged every step has them all there), the whole window only if not.
    seen = loss[max(0, end - 4 * want) : end]
    seen = seen[np.isfinite(seen)]
    if seen.size < want and end > 4 * want:
        seen = loss[:end][np.isfinite(loss[:end])]
    values = seen[-want:].tolist()
    if len(values) < 2 * RECENT_LOSS:
        return False
    # statistics, not np.median (which imports numpy.ma on the sampler thread); a few dozen
    # Python floats sort faster than numpy's call overhead.
    recent = statistics.median(values[-RECENT_LOSS:])
    earlier = statistics.median(values[:-RECENT_LOSS])
    return bool(recent < FALLING * earlier)


def _lr_so_far(view: HealthView) -> tuple[FloatArray, IntArray, FloatArray] | None:
    """For each row of the lr column, the largest finite lr up to it (NaN before the first)
    and the row of the last finite one (-1 before the first), and the column: made once a
    check for the measured steps it judges (``HealthView.shared``)."""
    lr = view.column("lr")
    if lr is None:
        return None
    finite = np.isfinite(lr)
    largest: FloatArray = np.fmax.accumulate(np.where(finite, lr, np.nan))
    last: IntArray = np.maximum.accumulate(np.where(finite, np.arange(lr.size), -1))
    return largest, last, lr


@functools.lru_cache(maxsize=8)
def weight_rows(names: tuple[str, ...]) -> BoolArray:
    """Which layers are weights, not biases (read-only: shared between checks)."""
    mask = np.array([not name.endswith("bias") for name in names], dtype=bool)
    mask.flags.writeable = False
    return mask


class UpdateRatioHigh(_UpdateRatio):
    name = "update_ratio_high"
    doc = RuleDoc(
        SYMPTOM,
        "updates far larger than healthy (`‖Δw‖/‖w‖` ≫ 1e-3) while the loss is not falling",
        "`‖Δw‖/‖w‖` above 0.1 in some layers on 3 measured steps in a row while the loss is not "
        "falling",
        "lower the learning rate",
        (
            "large early updates that bring the loss down (momentum building up)",
            "zero-initialised adapters in their first steps",
        ),
    )

    def _judged(self, view: HealthView, ratios: FloatArray, step: int) -> BoolArray:
        # Biases are often initialised to zero and stay near it, so ||w|| ~ 0 makes the ratio
        # large while nothing is wrong; the hint is about weights.
        judged: BoolArray = np.isfinite(ratios) & weight_rows(view.layer_names)
        if loss_falling(view, step):
            # Large updates that bring the loss down are the point (SGD's momentum builds up
            # over the first tens of steps, and a small head moves far); a learning rate too
            # high shows as large updates with a loss that stops falling or climbs.
            judged[:] = False
        return judged

    def _beyond(self, ratios: FloatArray) -> BoolArray:
        return ratios > self.thresholds.update_ratio_high

    def _possible(self, view: HealthView, ratios: FloatArray) -> BoolArray:
        beyond: BoolArray = (ratios > self.thresholds.update_ratio_high) & weight_rows(
            view.layer_names
        )[:, None]
        return beyond

    def _extreme(self, values: list[float]) -> float:
        return max(values)

    def _message(self, names: str, extreme: float, step: int) -> str:
        return (
            f"Updates are large for {names} (||Δw||/||w|| up to {num(extreme)}; "
            f"{HEALTHY_UPDATE}) at step {step}: learning rate too high?"
        )


class UpdateRatioLow(_UpdateRatio):
    name = "update_ratio_low"
    doc = RuleDoc(
        SYMPTOM,
        "updates far smaller than healthy (`‖Δw‖/‖w‖` below 1e-6)",
        "`‖Δw‖/‖w‖` below 1e-6 in some layers on the measured steps from step 20",
        "raise the learning rate, or check that the parameters really train",
        ("frozen layers", "schedules that end near 0"),
    )

    def reset(self) -> None:
        super().reset()
        self._lr_max = 0.0

    def _judged(self, view: HealthView, ratios: FloatArray, step: int) -> BoolArray:
        # An update of exactly 0 is no gradient, a frozen parameter or lr == 0: the static
        # checks (debug.check_setup, gradient_not_flowing) name those, so skip them here.
        judged = np.isfinite(ratios) & (ratios > 0)
        # A schedule that has decayed the learning rate far below its peak (the end of a
        # cosine decay) makes tiny updates on purpose.
        if self._decayed(view, step):
            return np.zeros_like(judged)
        if view.grads is not None and view.grads.shape[1]:
            latest = view.grads[:, -1]
            judged &= np.isfinite(latest) & (latest > 0)
        # A bias right before a norm layer (its gradient sums to ~0 by construction) barely
        # moves while its module's weight learns: nothing is wrong with it.
        return judged & ~cancelled_biases(view.layer_names, judged & self._beyond(ratios), judged)

    def _decayed(self, view: HealthView, step: int) -> bool:
        """Whether the learning rate at ``step`` has decayed far below the run's largest so
        far (which it keeps: the largest finite lr up to each measured step judged)."""
        lr = view.shared("lr so far", lambda: _lr_so_far(view))
        if lr is None:
            return False
        # The finite lrs up to ``step``: their largest and the last of them.
        end = int(np.searchsorted(view.step_col, step, side="right"))
        last = int(lr[1][end - 1]) if end else -1
        if last < 0:
            return False
        self._lr_max = max(self._lr_max, float(lr[0][end - 1]))
        return bool(lr[2][last] < DECAYED_LR * self._lr_max)

    def _note(self, view: HealthView, step: int) -> None:
        # The largest lr so far grows with the step: the last measured step's is the
        # largest of them all.
        self._decayed(view, step)

    def _beyond(self, ratios: FloatArray) -> BoolArray:
        return ratios < self.thresholds.update_ratio_low

    def _possible(self, view: HealthView, ratios: FloatArray) -> BoolArray:
        beyond: BoolArray = (ratios > 0) & (ratios < self.thresholds.update_ratio_low)
        return beyond

    def _extreme(self, values: list[float]) -> float:
        return min(values)

    def _message(self, names: str, extreme: float, step: int) -> str:
        return (
            f"Updates are tiny for {names} (||Δw||/||w|| down to {num(extreme)}; "
            f"{HEALTHY_UPDATE}) at step {step}: learning rate too low, or parameters not "
            "really training?"
        )


__all__ = ["UpdateRatioHigh", "UpdateRatioLow", "loss_falling", "weight_rows"]
