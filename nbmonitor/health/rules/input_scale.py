"""Inputs on a scale far from the unit scale default initialisations assume, read as the
first layer's input on sampled steps (an on-device abs-mean and abs-max, read later by the
sampler: ``_capture/probes/structure.py``). A first layer that normalises its own input
(BatchNorm, LayerNorm) or takes indices (Embedding) is not read."""

from __future__ import annotations

import numpy as np

from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.structure import observed
from nbmonitor.health.view import HealthView
from nbmonitor.health.wording import num

LEAST = 2
RECENT = 8
# Default initialisations (Kaiming, Xavier, torch's Linear/Conv) size the weights for inputs of
# about unit scale: a typical input magnitude ten times that puts the first layer's
# pre-activations (and its gradients) an order of magnitude off, and saturates tanh/sigmoid.
SCALE = 10.0


class InputsNotNormalised(Base):
    name = "inputs_not_normalised"
    explains = (
        "exploding_gradients",
        "gradient_spike",
        "loss_spike",
        "loss_non_finite",
        "grad_non_finite",
        "update_ratio_high",
        "vanishing_gradients",
        "dead_units",
        "loss_plateau",
        "lr_too_high",
    )
    doc = RuleDoc(
        CAUSE,
        names="input features on a scale of tens to thousands (raw pixels 0-255, unscaled "
        "features) reach the first layer",
        evidence=f"the mean |x| of the first layer's input is at least {SCALE:g} (the unit "
        "scale default initialisations assume, ten times over), on every sampled step",
        fix="standardise the inputs (subtract the mean, divide by the std; pixels / 255)",
        silent_on=(
            "standardised inputs",
            "token ids into an Embedding",
            "a first layer that normalises (BatchNorm, LayerNorm)",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        seen = observed(view, "forward", RECENT, LEAST, key="input_abs_mean")
        if seen is None:
            return nothing(self.name)
        structure, obs = seen
        means = np.array([o.number("input_abs_mean") or np.nan for o in obs])
        maxes = np.array([o.number("input_abs_max") or np.nan for o in obs])
        if not np.isfinite(means).all():
            return nothing(self.name)
        if float(means.min()) < SCALE:
            return clear(self.name)
        layer = str(obs[-1].get("first_layer"))
        model = structure.latest("model")
        params = model.get("first_layer_params") if model is not None else None
        names = (
            (layer, *(p for p in params if isinstance(p, str)))
            if isinstance(params, tuple)
            else (layer,)
        )
        kind = model.get("first_layer_kind") if model is not None else None
        since = structure.held_since(
            "forward", "input_abs_mean", LEAST, lambda o: (o.number("input_abs_mean") or 0) >= SCALE
        )
        step = since if since is not None else obs[-1].step
        step = min(step, int(view.step_col[-1])) if view.step_col.size else step
        typical = float(np.median(means))

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause="the inputs are not normalised: features on a scale of "
                    f"{num(typical)} reach the first layer",
                    said=f"mean |x| {num(typical)}, max |x| {num(float(np.nanmax(maxes)))} at the "
                    f"input of {layer} ({kind}), on {len(obs)} sampled steps",
                    evidence={
                        "input_abs_mean": [float(m) for m in means],
                        "input_abs_max": [float(m) for m in maxes],
                        "first_layer": layer,
                        "steps": [o.step for o in obs],
                    },
                    fix="standardise the inputs (subtract the mean and divide by the std of the "
                    "training set; pixels / 255)",
                    layers=names,
                    place=layer,
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


__all__ = ["InputsNotNormalised"]
