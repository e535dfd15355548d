"""The training panel: loss (raw and smoothed), learning rate, gradient norm (with the share of
clipped steps), step time (rolling median in its min-max band) and throughput (raw and its
rolling median). The learning-rate changes asked while the run went (steering events, rule
``steer``, action ``lr``) are marks on the lr chart: ``marks.lr``, ``[step, lr]`` pairs."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from nbmonitor._engine.frame import Frame
from nbmonitor.ui.console import clip_summary
from nbmonitor.ui.panels.base import CurvesPanel, Transform

KEYS = (
    "loss",
    "loss_smooth",
    "lr",
    "grad_norm",
    "step_time_median",
    "step_time_min",
    "step_time_max",
    "samples_per_s",
    "samples_per_s_smooth",
    "tokens_per_s",
    "tokens_per_s_smooth",
)


# The lr changes a chart marks: the newest ones (a frame carries only its newest alerts, so the
# panel keeps those it saw).
MAX_MARKS = 100
STEER_RULE = "steer"


class TrainingPanel(CurvesPanel):
    name: ClassVar[str] = "training"

    def __init__(self) -> None:
        super().__init__()
        self._lr_marks: dict[int, float] = {}

    def extra(self, frame: Frame) -> dict[str, Any]:
        for alert in frame.alerts:
            evidence = alert.evidence
            if alert.rule != STEER_RULE or evidence.get("action") != "lr" or not evidence.get("ok"):
                continue
            value = evidence.get("value")
            if isinstance(value, int | float) and math.isfinite(value):
                self._lr_marks[int(alert.step)] = float(value)
        if len(self._lr_marks) > MAX_MARKS:
            for step in sorted(self._lr_marks)[:-MAX_MARKS]:
                del self._lr_marks[step]
        if not self._lr_marks:
            return {}
        return {"marks": {"lr": [[step, lr] for step, lr in sorted(self._lr_marks.items())]}}

    def keys(self, frame: Frame) -> list[tuple[str, Transform | None]]:
        return [(key, None) for key in KEYS]

    def notes(self, frame: Frame) -> dict[str, Any]:
        return {"grad_norm": clip_summary(frame.latest)}
