"""Process and system statistics from psutil; the base every other backend extends."""

from __future__ import annotations

import math

import psutil
import torch

from nbmonitor.backends._procfs import ProcCounters

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

    On Linux the counters are read from ``/proc`` through descriptors held open
    (:class:`ProcCounters`: the same figures as psutil, without an ``open()`` per reading);
    elsewhere from psutil, whose first ``cpu_percent()`` call returns a meaningless 0.0 (it has
    no previous reading to compare with), so both of its counters are primed at construction.
    """

    name = "cpu"

    def __init__(self) -> None:
        self.devices: tuple[str, ...] = ()
        self._closed = False
        self._proc: ProcCounters | None
        try:
            self._proc = ProcCounters()
        except (OSError, ValueError, IndexError):
            self._proc = None
            self._process = psutil.Process()
            self._process.cpu_percent(None)
            psutil.cpu_percent(None)

    @property
    def keys(self) -> tuple[str, ...]:
        return CPU_KEYS

    def sample(self) -> dict[str, float]:
        out = dict.fromkeys(CPU_KEYS, math.nan)
        proc = self._proc
        if self._closed:
            # A late tick after close: its descriptors are gone (and their numbers may be
            # another file's by now), so nothing is read.
            return out
        if proc is not None:
            out["cpu_percent"] = proc.cpu_percent()
            out["process_cpu_percent"] = proc.process_cpu_percent()
            out["process_rss_bytes"] = proc.rss_bytes()
            total, available = proc.memory()
        else:
            out["cpu_percent"] = float(psutil.cpu_percent(None))
            with self._process.oneshot():
                out["process_cpu_percent"] = float(self._process.cpu_percent(None))
                out["process_rss_bytes"] = float(self._process.memory_info().rss)
            vm = psutil.virtual_memory()
            total, available = float(vm.total), float(vm.available)
        out["ram_used_bytes"] = total - available
        out["ram_total_bytes"] = total
        out["ram_percent"] = (total - available) / total * 100.0 if total > 0 else math.nan
        out["torch_threads"] = float(torch.get_num_threads())
        return out

    def device_gauges(self, sample: dict[str, float]) -> list[dict[str, float | str]]:
        """No accelerator, so no gauges (the dashboard shows CPU/RAM from the sample)."""
        return []

    def close(self) -> None:
        self._closed = True
        if self._proc is not None:
            self._proc.close()
