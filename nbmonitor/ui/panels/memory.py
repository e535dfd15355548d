"""The memory panel: the memory of the device the model trains on, step by step (on CUDA
allocated, reserved, each interval's peak and fragmentation; on the CPU the process's resident
size; on MPS the driver's allocation), the headroom with the largest batch estimated to fit,
and the table of what holds memory on each device (parameters, buffers, gradients, optimizer
state, activations saved for backward, other; docs/memory.md)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from nbmonitor._engine.frame import Frame
from nbmonitor.ui.panels.base import CurvesPanel, Transform, series_state
from nbmonitor.ui.panels.layers import jsonable

CUDA_KEYS = (
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "cuda_interval_peak_bytes",
    "cuda_inactive_split_bytes",
)
OTHER_KEYS = ("process_rss_bytes", "mps_driver_allocated_bytes")
NOTE_KEYS = (
    "memory_peak_bytes",
    "memory_limit_bytes",
    "batch_size",
    "batch_fits",
    "batch_fits_more",
)


class MemoryPanel(CurvesPanel):
    name: ClassVar[str] = "memory"

    def keys(self, frame: Frame) -> list[tuple[str, Transform | None]]:
        cuda = any(key in frame.series for key in CUDA_KEYS)
        return [(key, None) for key in (CUDA_KEYS if cuda else OTHER_KEYS)]

    def notes(self, frame: Frame) -> dict[str, Any]:
        # JSON has no NaN: an unknown figure is left out.
        notes: dict[str, Any] = {
            key: float(frame.latest[key])
            for key in NOTE_KEYS
            if key in frame.latest and math.isfinite(frame.latest[key])
        }
        if frame.allocator:
            notes["allocator"] = frame.allocator
        return notes

    def state(self, frame: Frame) -> dict[str, Any] | None:
        """The curves and notes, and ``table`` (one row per device, NaN as null) with the
        breakdown's ``table_step`` and ``activations_step`` once a breakdown exists."""
        curves = {
            key: series_state(s)
            for key, _ in self.keys(frame)
            if (s := frame.series.get(key)) is not None and len(s.x)
        }
        state: dict[str, Any] = {"series": curves, "notes": self.notes(frame)}
        table = frame.memory
        if table is not None:
            state["table"] = [jsonable(row) for row in table.rows]
            state["table_step"] = table.step
            state["activations_step"] = table.activations_step
        return self._unchanged.filter(state)
