"""Process and system statistics (Linux: /proc through held descriptors; elsewhere psutil);
the base every other backend extends."""

from __future__ import annotations

import math
import sys

import psutil

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
        self.device_index: int | None = None
        self.notes: list[str] = []
        self._closed = False
        self._proc: ProcCounters | None
        try:
            self._proc = ProcCounters()
        except OSError:  # what ProcCounters raises for any /proc it cannot use
            self._proc = None
            self._start_psutil()

    def _start_psutil(self) -> None:
        self._process = psutil.Process()
        self._process.cpu_percent(None)
        psutil.cpu_percent(None)

    @property
    def source(self) -> str:
        """Where the counters are read from: ``"/proc"`` (descriptors held open, Linux) or
        ``"psutil"`` (elsewhere, or where ``/proc`` cannot be used or stopped reading)."""
        return "/proc" if self._proc is not None else "psutil"

    @property
    def keys(self) -> tuple[str, ...]:
        return CPU_KEYS

    def sample(self) -> dict[str, float]:
        out = dict.fromkeys(CPU_KEYS, math.nan)
        if self._closed:
            # A late tick after close: its descriptors are gone (and their numbers may be
            # another file's by now), so nothing is read.
            return out
        proc = self._proc
        if proc is not None:
            try:
                out["cpu_percent"] = proc.cpu_percent()
                out["process_cpu_percent"] = proc.process_cpu_percent()
                out["process_rss_bytes"] = proc.rss_bytes()
                total, available = proc.memory()
            except (OSError, ValueError, IndexError):
                # /proc opened but cannot be read as expected (some sandboxes): psutil from
                # now on. Its percentages need a first reading to compare with, so this
                # sample has none (NaN, not psutil's meaningless first 0.0).
                proc.close()
                self._proc = None
                self._start_psutil()
                out["cpu_percent"] = out["process_cpu_percent"] = math.nan
                total, available = self._psutil_memory(out)
        else:
            out["cpu_percent"] = float(psutil.cpu_percent(None))
            out["process_cpu_percent"] = float(self._process.cpu_percent(None))
            total, available = self._psutil_memory(out)
        out["ram_used_bytes"] = total - available
        out["ram_total_bytes"] = total
        out["ram_percent"] = (total - available) / total * 100.0 if total > 0 else math.nan
        # Not imported here: the machine view (nbmonitor top) samples without torch.
        torch = sys.modules.get("torch")
        out["torch_threads"] = float(torch.get_num_threads()) if torch is not None else math.nan
        return out

    def _psutil_memory(self, out: dict[str, float]) -> tuple[float, float]:
        """Fills in the process's RSS; the machine's total and available memory."""
        out["process_rss_bytes"] = float(self._process.memory_info().rss)
        vm = psutil.virtual_memory()
        return float(vm.total), float(vm.available)

    def device_gauges(self, sample: dict[str, float]) -> list[dict[str, float | str]]:
        """No accelerator, so no gauges (the dashboard shows CPU/RAM from the sample)."""
        return []

    def close(self) -> None:
        self._closed = True
        if self._proc is not None:
            self._proc.close()
