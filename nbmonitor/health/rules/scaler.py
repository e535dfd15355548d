"""Optimizer steps skipped by a ``GradScaler`` over and over: mixed-precision gradients that
overflow at every scale the scaler tries. Subject: ``"run"``.

Reads ``step_skipped`` (1 on a step the scaler skipped, ``_engine/assemble/steps.py``). A
scaler skips a few steps while it finds its scale, and one now and then when it tries a larger
one: ``skip_steps`` skipped among the last ``2 x skip_steps`` steps is more than that.
"""

from __future__ import annotations

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.view import HealthView
from nbmonitor.health.window import trailing_counts

SKIPPED = "step_skipped"


class ScalerSkipping(Base):
    name = "scaler_skipping"
    doc = RuleDoc(
        CAUSE,
        "a `GradScaler` skips most optimizer steps: float16 gradients overflow at every scale",
        "`step_skipped` on at least `skip_steps` (20) of the last 40 steps",
        "find the overflow (`check_forward=True`), keep the loss in float32, or use bfloat16",
        ("a scaler finding its scale in the first steps", "a skip now and then"),
    )

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        skipped = view.column(SKIPPED)
        if skipped is None or not view.has_new_rows:
            return nothing(rule)
        span = 2 * t.skip_steps
        count, size = trailing_counts(skipped == 1.0, span)
        holds = count[view.new_from :] >= t.skip_steps
        if not holds.any():
            return clear(rule)
        row = view.new_from + int(np.flatnonzero(holds)[0])
        step = float(view.step_col[row])
        n, of = int(count[row]), int(size[row])

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    rule,
                    cause="The GradScaler skips most optimizer steps: the float16 gradients "
                    "overflow at every scale it tries, so those steps train nothing",
                    said=f"it skipped {n} of the last {of} optimizer steps, by step {int(step)}",
                    evidence={"skipped": n, "of_steps": of, "first_step": int(step)},
                    fix="find the overflow (attach(..., check_forward=True) names the first "
                    "module with an Inf output) and keep the loss and large reductions in "
                    "float32, or train in bfloat16",
                    step=int(step),
                    time=view.time_at(step),
                    subject=subjects.RUN,
                )
            ]

        return Outcome(rule, ("",), always, make)


__all__ = ["ScalerSkipping"]
