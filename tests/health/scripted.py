"""A rule scripted by step, for tests of what Health does with rules' verdicts (the
differential diagnosis, explain, the run log): it holds on the steps it is told."""

from __future__ import annotations

import numpy as np

from nbmonitor.health import Alert, Thresholds
from nbmonitor.health.diagnose import cause_alert, symptom_alert
from nbmonitor.health.rule import Base, Outcome, always, nothing
from nbmonitor.health.view import HealthView


class Scripted(Base):
    """Holds for ``subjects`` on the new steps within [start, end] (inclusive)."""

    def __init__(
        self,
        name: str,
        start: int,
        end: int,
        *,
        explains: tuple[str, ...] = (),
        subjects: tuple[str, ...] = ("",),
        thresholds: Thresholds | None = None,
    ) -> None:
        super().__init__(thresholds or Thresholds())
        self.name, self.start, self.end, self.explains = name, start, end, explains
        self.subjects = subjects

    def check(self, view: HealthView) -> Outcome:
        if not view.has_new_rows:
            return nothing(self.name)
        new = view.step_col[view.new_from :]
        hits = new[(new >= self.start) & (new <= self.end)]
        if not hits.size:
            return Outcome(self.name, (), always, lambda _new: [])
        step = int(hits[0])

        def make(names: list[str]) -> list[Alert]:
            layers = tuple(n for n in names if n)
            if self.explains:
                return [
                    cause_alert(
                        self.name,
                        cause=f"{self.name} happened",
                        fix="undo it",
                        evidence={"first_step": step, "norms": np.array([1.0, 2.0])},
                        layers=layers,
                        step=step,
                        time=1000.0 + step,
                    )
                ]
            return [
                symptom_alert(
                    self.name,
                    seen=f"{self.name} seen",
                    hint="check it",
                    evidence={"value": 3.5},
                    layers=layers,
                    step=step,
                    time=1000.0 + step,
                )
            ]

        return Outcome(self.name, list(self.subjects), always, make)
