"""The training panel: loss (raw and smoothed), learning rate, gradient norm (with the share of
clipped steps), step time (rolling median in its min-max band) and throughput (raw and its
rolling median)."""

from __future__ import annotations

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


class TrainingPanel(CurvesPanel):
    name: ClassVar[str] = "training"

    def keys(self, frame: Frame) -> list[tuple[str, Transform | None]]:
        return [(key, None) for key in KEYS]

    def notes(self, frame: Frame) -> dict[str, Any]:
        return {"grad_norm": clip_summary(frame.latest)}
