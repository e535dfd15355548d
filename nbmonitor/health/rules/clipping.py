"""Gradient clipping that is active on most steps (``clip_grad_norm_``'s threshold is below
the usual gradient norm, or the learning rate is too high). Subject: ``"grad_norm"``.

Reads ``grad_clip_coef``, the factor ``clip_grad_norm_`` scaled the gradients by (1: not
clipped), which the engine fills on steps that clipped once (``_engine/assemble/steps.py``).
"""

from __future__ import annotations

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.view import HealthView
from nbmonitor.health.window import row_medians, trailing_counts
from nbmonitor.health.wording import num

COEF = "grad_clip_coef"


class ClippingActive(Base):
    """``clip_grad_norm_`` scaled the gradients on ``clip_fraction`` or more of the last
    ``window`` steps that clipped, judged once ``clip_steps`` of them are known."""

    name = "clipping_active"
    doc = RuleDoc(
        CAUSE,
        "`clip_grad_norm_`'s `max_norm` is below the usual gradient norm: clipping shrinks every "
        "step",
        "`grad_clip_coef` below 1 on 90 % or more of the last 100 steps, judged from 40 clipped "
        "steps on",
        "raise `max_norm` (or lower the learning rate if the norms keep growing)",
        ("clipping that acts now and then (a spike)", "clipping in the first steps only"),
    )

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        coef = view.column(COEF)
        if coef is None or not view.has_new_rows:
            return nothing(rule)
        known = np.flatnonzero(np.isfinite(coef))
        if known.size < t.clip_steps:
            return nothing(rule)
        clipped, size = trailing_counts(coef[known] < 1.0, t.window)
        new = known >= view.new_from
        judged = new & (size >= t.clip_steps)
        if not judged.any():
            return nothing(rule)
        holds = judged & (clipped >= t.clip_fraction * size)
        if not holds.any():
            return clear(rule)
        at = int(np.flatnonzero(holds)[0])
        rows = known[max(0, at + 1 - int(size[at])) : at + 1]
        step = float(view.step_col[known[at]])
        share = float(clipped[at] / size[at])
        grads = view.column("grad_norm")
        norm = float(row_medians(grads[None, rows])[0][0]) if grads is not None else np.nan
        # clip_grad_norm_ scales by max_norm / (norm + 1e-6): max_norm back from the two.
        limit = (
            float(row_medians((coef[rows] * (grads[rows] + 1e-6))[None, :])[0][0])
            if (grads is not None)
            else np.nan
        )

        def make(_new: list[str]) -> list[Alert]:
            return [
                Alert(
                    rule,
                    "warning",
                    f"Gradient clipping is active on {share:.0%} of the last {int(size[at])} "
                    f"steps (at step {int(step)}; median grad norm {num(norm)} against "
                    f"max_norm {num(limit)}): clipping every step makes the learning rate "
                    "smaller than set and hides explosions. Raise max_norm to about the usual "
                    "gradient norm, or lower the learning rate if the norms keep growing.",
                    int(step),
                    view.time_at(step),
                    subject=subjects.GRAD_NORM,
                )
            ]

        return Outcome(rule, ("",), always, make)


__all__ = ["ClippingActive"]
