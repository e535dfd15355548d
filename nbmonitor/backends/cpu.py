"""Process and system statistics from psutil; the base every other backend extends."""

from __future__ import annotations

import math

import psutil
import torch

CPU_KEYS = (
    "cpu_percent",
    "process_cpu_percent",
    "process_rss_bytes",
    "ram_used_bytes",
    "ram_total_bytes",
    "ram_percent",
    "torch_threads",
)


class CpuBackend:
    """CPU/RAM of this process and of the machine.

    psutil's first ``cpu_percent()`` call returns a meaningless 0.0 (it has no previous reading
    to compare with), so both counters are primed at construction.
    """

    name = "cpu"

    def __init__(self) -> None:
        self.devices: tuple[str, ...] = ()
        self._process = psutil.Process()
        self._process.cpu_percent(None)
        psutil.cpu_percent(None)

    @property
    def keys(self) -> tuple[str, ...]:
        return CPU_KEYS

    def sample(self) -> dict[str, float]:
        out = dict.fromkeys(CPU_KEYS, math.nan)
        out["cpu_percent"] = float(psutil.cpu_percent(None))
        with self._process.oneshot():
            out["process_cpu_percent"] = float(self._process.cpu_percent(None))
            out["process_rss_bytes"] = float(self._process.memory_info().rss)
        vm = psutil.virtual_memory()
        out["ram_used_bytes"] = float(vm.total - vm.available)
        out["ram_total_bytes"] = float(vm.total)
        out["ram_percent"] = float(vm.percent)
        out["torch_threads"] = float(torch.get_num_threads())
        return out

    def device_gauges(self, sample: dict[str, float]) -> list[dict[str, float | str]]:
        """No accelerator, so no gauges (the dashboard shows CPU/RAM from the sample)."""
        return []

    def close(self) -> None:
        pass
