"""The system panel: CPU and RAM of the machine and this process, and per accelerator its
utilisation, memory (as a share of its total), temperature and power."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import Frame
from nbmonitor.ui.panels.base import CurvesPanel, Transform

HOST_KEYS = ("cpu_percent", "process_cpu_percent", "ram_used_bytes", "process_rss_bytes")
DEVICE_KEYS = ("util_percent", "temperature_c", "power_w")


def percent_of(total_key: str) -> Transform:
    def transform(
        y: npt.NDArray[np.float64], latest: Mapping[str, float]
    ) -> npt.NDArray[np.float64]:
        total = latest.get(total_key, float("nan"))
        if not np.isfinite(total) or total <= 0:
            return np.full_like(y, np.nan)
        return y * (100.0 / total)

    return transform


def device_indices(frame: Frame) -> list[int]:
    """The accelerators with a card or a series (gpu0_..., gpu1_...)."""
    found = set(range(len(frame.devices)))
    for key in frame.series:
        if key.startswith("gpu") and key.endswith("_util_percent"):
            digits = key[3 : -len("_util_percent")]
            if digits.isdigit():
                found.add(int(digits))
    return sorted(found)


class SystemPanel(CurvesPanel):
    name: ClassVar[str] = "system"

    def keys(self, frame: Frame) -> list[tuple[str, Transform | None]]:
        keys: list[tuple[str, Transform | None]] = [(key, None) for key in HOST_KEYS]
        for i in device_indices(frame):
            p = f"gpu{i}_"
            keys += [(p + key, None) for key in DEVICE_KEYS]
            keys.append((p + "mem_used_bytes", percent_of(p + "mem_total_bytes")))
        return keys

    def notes(self, frame: Frame) -> dict[str, Any]:
        return {"devices": device_indices(frame)}
