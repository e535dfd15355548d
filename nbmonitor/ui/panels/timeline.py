"""The time panel: where the time goes. The step phases stacked against the step (so that a
step-time spike shows the phase that grew), a gantt of the last steps' phases and spans, and the
telemetry summary (count, mean, median, std, min, max, total, % of run per phase and span, as
Oumi's timers print it). Empty until a frame has phases or spans."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from nbmonitor._engine.frame import Frame, TimelineFrame
from nbmonitor.ui.codec import encode
from nbmonitor.ui.panels.base import Unchanged
from nbmonitor.ui.panels.layers import jsonable

MAX_BARS = 300
SUMMARY_KEYS = (
    "name",
    "kind",
    "count",
    "mean_s",
    "median_s",
    "std_s",
    "min_s",
    "max_s",
    "total_s",
    "percent",
)


def timeline_state(timeline: TimelineFrame) -> dict[str, Any]:
    seconds = np.asarray(timeline.seconds, dtype=np.float64)
    steps = np.asarray(timeline.steps, dtype=np.float64)
    if seconds.ndim != 2 or seconds.shape != (len(timeline.phases), len(steps)):
        seconds, steps, phases = np.zeros((0, 0)), np.zeros(0), []
    else:
        phases = list(timeline.phases)
    bars = timeline.gantt[-MAX_BARS:]
    return {
        "phases": phases,
        "steps": encode(steps),
        "seconds": encode(seconds),
        # [track, name, step, start (s), duration (s)]
        "gantt": [
            [b.track, b.name, int(b.step), jsonable(b.start_s), jsonable(b.duration_s)]
            for b in bars
        ],
        "summary": [{k: jsonable(row.get(k)) for k in SUMMARY_KEYS} for row in timeline.summary],
        # Which steps' phases were timed on the device (every n-th), said under the chart.
        "device_every": int(timeline.device_every),
    }


class TimelinePanel:
    name: ClassVar[str] = "timeline"

    def __init__(self) -> None:
        self._unchanged = Unchanged()

    def state(self, frame: Frame) -> dict[str, Any] | None:
        if frame.timeline is None:
            return None  # keep what was shown: a frame without detail has no timeline
        return self._unchanged.filter(timeline_state(frame.timeline))
