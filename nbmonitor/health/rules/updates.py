"""Rules on update ratios ||Δw||/||w||: too large (learning rate too high) or too small.
Subject: ``"layers"``.

Ratios arrive every few steps, so only a changed array is a new observation, and a rule holds
for a layer after ``sustain_steps`` observations in a row: one noisy update raises nothing.
"""

from __future__ import annotations

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.rule import Base, Outcome, nothing
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import View
from nbmonitor.health.window import BoolArray, FloatArray
from nbmonitor.health.wording import HEALTHY_UPDATE, name_list, num


class _UpdateRatio(Base):
    """A streak of observations beyond a limit, per layer; subclasses say which layers are
    judged, which side of the limit is bad, and how to word it."""

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._names: tuple[str, ...] | None = None
        self._prev: FloatArray | None = None
        self._streak = np.zeros(0, dtype=np.intp)

    def _judged(self, view: View, ratios: FloatArray) -> BoolArray:
        raise NotImplementedError

    def _beyond(self, ratios: FloatArray) -> BoolArray:
        raise NotImplementedError

    def _extreme(self, values: list[float]) -> float:
        raise NotImplementedError

    def _message(self, names: list[str], extreme: float, step: int) -> str:
        raise NotImplementedError

    def check(self, view: View) -> Outcome:
        rule = self.name
        t = self.thresholds
        given = view.inp.update_ratios
        names = view.layer_names
        if given is None or given.shape != (len(names),):
            return nothing(rule)
        ratios = np.asarray(given, dtype=np.float64)
        if self._names != names:
            self._names = names
            self._prev = None
            self._streak = np.zeros(len(names), dtype=np.intp)
        fresh = self._prev is None or not np.array_equal(ratios, self._prev, equal_nan=True)
        if not fresh or view.inp.step < t.min_history:
            return nothing(rule)
        self._prev = ratios.copy()
        judged = self._judged(view, ratios)
        self._streak = np.where(judged & self._beyond(ratios), self._streak + 1, 0)
        held = [names[i] for i in np.flatnonzero(self._streak >= t.sustain_steps)]
        step = view.inp.step

        def make(new: list[str]) -> list[Alert]:
            index = view.layer_index()
            extreme = self._extreme([float(ratios[index[name]]) for name in new])
            return [
                Alert(
                    rule,
                    "warning",
                    self._message(new, extreme, step),
                    step,
                    view.inp.time,
                    tuple(new),
                    subject=subjects.LAYERS,
                )
            ]

        return Outcome(rule, held, view.layer_judged(judged), make)


class UpdateRatioHigh(_UpdateRatio):
    name = "update_ratio_high"

    def _judged(self, view: View, ratios: FloatArray) -> BoolArray:
        # Biases are often initialised to zero and stay near it, so ||w|| ~ 0 makes the ratio
        # large while nothing is wrong; the hint is about weights.
        weights = np.array([not name.endswith("bias") for name in view.layer_names], dtype=bool)
        judged: BoolArray = np.isfinite(ratios) & weights
        return judged

    def _beyond(self, ratios: FloatArray) -> BoolArray:
        return ratios > self.thresholds.update_ratio_high

    def _extreme(self, values: list[float]) -> float:
        return max(values)

    def _message(self, names: list[str], extreme: float, step: int) -> str:
        return (
            f"Updates are large for {name_list(names)} (||Δw||/||w|| up to {num(extreme)}; "
            f"{HEALTHY_UPDATE}) at step {step}: learning rate too high?"
        )


class UpdateRatioLow(_UpdateRatio):
    name = "update_ratio_low"

    def _judged(self, view: View, ratios: FloatArray) -> BoolArray:
        # An update of exactly 0 is no gradient, a frozen parameter or lr == 0: the static
        # checks (debug.check_setup, gradient_not_flowing) name those, so skip them here.
        judged = np.isfinite(ratios) & (ratios > 0)
        if view.grads is not None and view.grads.shape[1]:
            latest = view.grads[:, -1]
            judged &= np.isfinite(latest) & (latest > 0)
        return judged

    def _beyond(self, ratios: FloatArray) -> BoolArray:
        return ratios < self.thresholds.update_ratio_low

    def _extreme(self, values: list[float]) -> float:
        return min(values)

    def _message(self, names: list[str], extreme: float, step: int) -> str:
        return (
            f"Updates are tiny for {name_list(names)} (||Δw||/||w|| down to {num(extreme)}; "
            f"{HEALTHY_UPDATE}) at step {step}: learning rate too low, or parameters not "
            "really training?"
        )


__all__ = ["UpdateRatioHigh", "UpdateRatioLow"]
