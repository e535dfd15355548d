"""What a view of the machine shows (``nbmonitor.devices()``, ``nbmonitor top``): the device
watch's Frame (latest sample, per-GPU gauges, alerts) plus what only the machine view has:
the processes on each GPU, the recent samples against time for sparklines, and the alert
thresholds to colour values against. Plain numbers, numpy arrays and strings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import Frame

FloatArray = npt.NDArray[np.float64]


class GpuProcess(NamedTuple):
    """A process using a GPU: its pid, its name (``"?"`` when the pid is not in this PID
    namespace, e.g. from a container) and the device memory NVML says it uses (NaN when not
    reported)."""

    pid: int
    name: str
    used_bytes: float


@dataclass(frozen=True)
class DevicesFrame:
    """One moment of the machine view.

    ``history`` holds the recent samples, oldest first, under their sample keys plus ``time``
    (seconds since the epoch): at most the last few minutes, so sparklines need no other
    store. ``thresholds`` are the device rules' (``temperature_c``, ``memory_fraction``,
    ``idle_util_percent``), for colouring values before an alert fires.
    """

    frame: Frame
    host: str
    interval: float
    processes: tuple[tuple[GpuProcess, ...], ...] = ()
    history: Mapping[str, FloatArray] = field(default_factory=dict)
    thresholds: Mapping[str, float] = field(default_factory=dict)
    run_dir: str | None = None
    notes: tuple[str, ...] = ()


__all__ = ["DevicesFrame", "GpuProcess"]
