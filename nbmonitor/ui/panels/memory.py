"""The memory panel: the memory of the device the model trains on, step by step (on CUDA
allocated, reserved, each interval's peak and fragmentation; on the CPU the process's resident
size; on MPS the driver's allocation), and the headroom with the largest batch estimated to
fit (docs/memory.md)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from nbmonitor._engine.frame import Frame
from nbmonitor.ui.panels.base import CurvesPanel, Transform

CUDA_KEYS = (
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "cuda_interval_peak_bytes",
    "cuda_inactive_split_bytes",
)
OTHER_KEYS = ("process_rss_bytes", "mps_driver_allocated_bytes")
NOTE_KEYS = ("memory_peak_bytes", "memory_limit_bytes", "batch_size", "batch_fits")


class MemoryPanel(CurvesPanel):
    name: ClassVar[str] = "memory"

    def keys(self, frame: Frame) -> list[tuple[str, Transform | None]]:
        cuda = any(key in frame.series for key in CUDA_KEYS)
        return [(key, None) for key in (CUDA_KEYS if cuda else OTHER_KEYS)]

    def notes(self, frame: Frame) -> dict[str, Any]:
        # JSON has no NaN: an unknown figure is left out.
        return {
            key: float(frame.latest[key])
            for key in NOTE_KEYS
            if key in frame.latest and math.isfinite(frame.latest[key])
        }
