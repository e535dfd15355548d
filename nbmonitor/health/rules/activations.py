"""Rules on activation statistics: dead units (outputs exactly zero). Subject: ``"layers"``
(the modules in ``Alert.layers``)."""

from __future__ import annotations

import math

from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import symptom_alert
from nbmonitor.health.doc import SYMPTOM, RuleDoc
from nbmonitor.health.rule import Base, Outcome, nothing
from nbmonitor.health.view import HealthView
from nbmonitor.health.wording import kinds_of, layer_list

# Module kinds whose zeros mean dead units (not a zero-initialised output layer or a mask).
RECTIFIERS = frozenset({"ReLU", "ReLU6", "Threshold", "Hardshrink", "Softshrink"})


class DeadUnits(Base):
    """A module whose outputs are exact zeros at least ``dead_fraction`` of the time."""

    name = "dead_units"
    doc = RuleDoc(
        SYMPTOM,
        "a module's outputs are exactly zero nearly always (dead ReLUs)",
        "the share of exact zeros in a module's sampled outputs (`activations=True`) at or above "
        "`dead_fraction` (99 %), judged from step 20",
        "lower the learning rate, use LeakyReLU/GELU, or check the initialisation, biases and "
        "input scaling",
        (
            "zero-initialised branches (LoRA B, zero-gamma norms) in the first steps",
            "ReLUs with a normal share of zeros (about half)",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        stats = view.inp.activations
        # Zero-initialised branches (LoRA B, zero-gamma norms) output exact zeros for the
        # first steps by design: judge only after min_history steps.
        if not stats or view.inp.step < t.min_history:
            return nothing(rule)
        fractions = {name: float(s.get("zero_frac", math.nan)) for name, s in stats.items()}
        judged = {name for name, f in fractions.items() if math.isfinite(f)}
        held = [name for name in fractions if name in judged and fractions[name] >= t.dead_fraction]
        step = view.inp.step
        kinds = view.inp.module_kinds

        def make(new: list[str]) -> list[Alert]:
            low = min(fractions[name] for name in new)
            rectifiers = bool(kinds_of(new, kinds) & RECTIFIERS)
            why = " (dead ReLUs: every pre-activation is negative)" if rectifiers else ""
            swap = "use LeakyReLU/GELU, " if rectifiers or not kinds else ""
            return [
                symptom_alert(
                    rule,
                    seen=f"Dead units: at least {low:.0%} of the outputs of "
                    f"{layer_list(new, kinds)} are exactly zero at step {step}{why}; the layers "
                    "before them get no gradient",
                    said="",
                    hint=f"lower the learning rate, {swap}or check the initialisation, the "
                    "biases and the input scaling",
                    evidence={
                        "zero_fraction": {name: fractions[name] for name in new},
                        "threshold": t.dead_fraction,
                        "kinds": {name: (kinds or {}).get(name, "") for name in new},
                    },
                    step=step,
                    time=view.inp.time,
                    layers=new,
                )
            ]

        return Outcome(rule, held, judged.__contains__, make, spreads=True)


__all__ = ["DeadUnits"]
