"""Labels that do not match the inputs (shuffled, misaligned): the loss stays at the chance
level while the optimizer works. Subject: ``"loss"``.

What tells it from a learning rate too low (the other cause of a loss that does not move) is
the weights: here they move at a healthy rate, step after step, and the gradients are not
small, yet nothing they learn lowers the loss, since there is nothing in the inputs to learn.
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
from nbmonitor.health.rules.updates import weight_rows
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView
from nbmonitor.health.window import FloatArray
from nbmonitor.health.wording import num

# The weights move at a healthy rate when the median weight layer's update ratio is at least
# this share of a healthy step (1e-3): a learning rate too low moves them far less.
HEALTHY_SHARE = 0.1
HEALTHY_RATIO = 1e-3
# A loss is at the chance level of k balanced classes when exp(loss) is within this share of
# the whole number k (cross-entropy of a model that predicts each class alike).
CHANCE_MATCH = 0.03
# The weights keep their size (the median weight layer's norm at least this share of what it
# was when the window began): weights that collapse are weight decay, not the labels.
KEPT = 0.5
# The first logged losses that set where the run started.
START_LOSSES = 10


def chance_classes(loss: float) -> int | None:
    """k when ``loss`` is ln(k) for a whole k >= 2 (within CHANCE_MATCH), else None."""
    if not (math.isfinite(loss) and 0.5 < loss < 12):
        return None
    k = round(math.exp(loss))
    return k if k >= 2 and abs(math.exp(loss) - k) <= CHANCE_MATCH * k else None


def sorted_median(values: FloatArray) -> float:
    """``statistics.median`` of a non-empty array, bit for bit (the middle of the sorted
    values, or the mean of the two middle ones), in two array calls instead of a Python sort
    of hundreds of floats (``np.median`` would import ``numpy.ma`` on the sampler thread)."""
    ordered = np.sort(values)
    half = ordered.size // 2
    if ordered.size % 2:
        return float(ordered[half])
    return float((ordered[half - 1] + ordered[half]) / 2)


class LabelsNotMatching(Base):
    """Over ``plateau_window`` steps the loss has not fallen (its last quarter's mean no lower
    than its first quarter's, within ``plateau_tolerance``, nor risen by half) and sits either
    at a chance level (ln k for k classes) or where the run started (within two robust sigmas
    of its own noise), while the median weight layer's update ratios over those steps are
    healthy (at least ``HEALTHY_SHARE`` x 1e-3, at most ``update_ratio_high``)."""

    name = "labels_not_matching"
    explains = ("loss_plateau",)
    doc = RuleDoc(
        CAUSE,
        "labels do not match the inputs (shuffled, misaligned): the loss stays at the chance level",
        "the loss flat over 200 steps at ln(k) for k classes, or where it started, while every "
        "step moves the weights at a healthy rate (`‖Δw‖/‖w‖` at least 1e-4)",
        "check that each batch's labels belong to its inputs (the same shuffle, the same index, "
        "the same order after any sort or augmentation)",
        ("a loss that falls, then flattens after converging", "a learning rate too low"),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._start: list[float] = []

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        loss = view.column("loss")
        if loss is None or not view.has_new_rows:
            return nothing(rule)
        if len(self._start) < START_LOSSES:
            after = -math.inf if view.last_step is None else view.last_step
            fresh = loss[(view.step_col > after) & np.isfinite(loss)]
            self._start.extend(float(v) for v in fresh[: START_LOSSES - len(self._start)])
        window = t.plateau_window
        if loss.size < window or len(self._start) < START_LOSSES:
            return nothing(rule)
        recent = loss[-window:]
        recent = recent[np.isfinite(recent)]
        quarter = window // 4
        if recent.size < window // 2:
            return nothing(rule)
        before = float(recent[:quarter].mean())
        after = float(recent[-quarter:].mean())
        stuck = before - t.plateau_tolerance * abs(before) <= after <= before * 1.5
        if not stuck:
            return clear(rule)
        start = statistics.median(self._start)
        classes = chance_classes(after)
        if classes is None:
            # Not at a chance level: it must sit where it started, within its own noise (two
            # robust sigmas: a median and a median of deviations of 200 losses, asked only
            # here).
            centre = sorted_median(recent)
            spread = 1.4826 * sorted_median(np.abs(recent - centre))
            if not abs(after - start) <= 2 * spread:
                return clear(rule)
        first = float(view.step_col[-window])
        level = self._update_level(view, first)
        if level is None:
            return nothing(rule)
        moving, kept = level
        healthy = HEALTHY_SHARE * HEALTHY_RATIO <= moving <= t.update_ratio_high
        # Weights that keep their size: collapsing ones are a weight decay too strong.
        if not (healthy and kept >= KEPT):
            return clear(rule)
        step = float(view.step_col[-1])

        def make(_new: list[str]) -> list[Alert]:
            level = (
                f"ln {classes} = {num(math.log(classes))}, the chance level of {classes} classes"
                if classes is not None
                else f"where it started ({num(start)})"
            )
            return [
                cause_alert(
                    rule,
                    cause="The labels do not match the inputs (shuffled or misaligned): the "
                    "model learns nothing that lowers the loss, which stays at the chance level",
                    said=f"loss {num(before)} -> {num(after)} over the last {window} steps, "
                    f"{level}, while every step moves the weights at a healthy rate "
                    f"(||Δw||/||w|| {num(moving)} in the median layer)",
                    evidence={
                        "loss_first_quarter": before,
                        "loss_last_quarter": after,
                        "loss_start": start,
                        "chance_classes": classes,
                        "update_ratio_median": moving,
                        "window_steps": window,
                        "step": int(step),
                    },
                    fix="check that each batch's labels belong to its inputs: the same index, "
                    "the same shuffle and order in the dataset and the loader",
                    step=int(step),
                    time=view.time_at(step),
                    subject=subjects.LOSS,
                )
            ]

        return Outcome(rule, ("",), always, make)

    def _update_level(self, view: HealthView, since: float) -> tuple[float, float] | None:
        """The median weight layer's median update ratio over the last ``sustain_steps``
        measured steps from ``since`` on, and its norm then against at the first of the
        measured steps from ``since`` (None: fewer of them, or none known)."""
        inp = view.inp
        steps, series, norms = inp.update_steps, inp.update_series, inp.param_series
        shape = (len(view.layer_names), steps.size if steps is not None else -1)
        if steps is None or series is None or norms is None:
            return None
        if series.shape != shape or norms.shape != shape:
            return None
        cols = np.flatnonzero(steps >= since)
        if cols.size < self.thresholds.sustain_steps:
            return None
        weights = weight_rows(view.layer_names)
        rows = series[weights][:, cols[-self.thresholds.sustain_steps :]]
        per_step = [
            statistics.median(c[np.isfinite(c)].tolist()) for c in rows.T if np.isfinite(c).any()
        ]
        with np.errstate(divide="ignore", invalid="ignore"):
            kept = norms[weights][:, cols[-1]] / norms[weights][:, cols[0]]
        kept = kept[np.isfinite(kept)]
        if not per_step or not kept.size:
            return None
        return statistics.median(per_step), statistics.median(kept.tolist())


__all__ = ["LabelsNotMatching", "chance_classes"]
