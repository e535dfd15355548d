"""The whole machine, no model: every NVIDIA GPU NVML sees, the processes on each, and the
machine's CPU, memory, disk and network, beside this process's own (a notebook kernel's).

What ``nbmonitor.devices()`` and ``nbmonitor top`` sample. No torch: GPUs are NVML's, numbered
as ``nvidia-smi`` numbers them (PCI bus order), whatever ``CUDA_VISIBLE_DEVICES`` says. The
GPU fields are the CUDA backend's (``_nvml_queries``, read by the same ``NvmlReader``), plus
the PCIe link's current generation and width; the NVLink links that are up are counted once,
at construction. NVML is initialised at construction (the caller asked to watch the machine:
it needs the device count); the PCIe throughput counters, which block ~20 ms each in the
driver, only with ``pcie=True``.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from nbmonitor._clock_events import decode_throttle
from nbmonitor._engine.frame import GpuProcess
from nbmonitor.backends import _nvml
from nbmonitor.backends._nvml_queries import GPU_FIELDS, PCIE_FIELDS, Gpu, Query, queries
from nbmonitor.backends._nvml_reader import NvmlReader
from nbmonitor.backends.cpu import CpuBackend

# The machine's CPU/RAM and this process's, as a run samples them (CpuBackend), then I/O rates.
IO_KEYS = (
    "disk_read_bytes_per_s",
    "disk_write_bytes_per_s",
    "net_recv_bytes_per_s",
    "net_sent_bytes_per_s",
    "process_read_bytes_per_s",
    "process_write_bytes_per_s",
)
LINK_FIELDS = ("pcie_gen", "pcie_width")
# Processes listed per GPU at most (the largest by memory): the view stays bounded.
MAX_PROCESSES = 16


class _Rates:
    """Bytes per second of cumulative counters, over the time since the previous reading."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._when = math.nan

    def update(self, counters: dict[str, float], now: float) -> dict[str, float]:
        dt = now - self._when
        out = {
            k: (v - self._last[k]) / dt if k in self._last and dt > 0 and v >= self._last[k]
            else math.nan
            for k, v in counters.items()
        }  # fmt: skip
        self._last, self._when = counters, now
        return out


class MachineBackend:
    """Every GPU on the machine (NVML) and the machine's CPU, RAM, disk and network.

    Keys: the CPU backend's (``cpu_percent``, ``process_cpu_percent``, ``process_rss_bytes``,
    ``ram_*``, ``torch_threads``), :data:`IO_KEYS`, and ``gpu{i}_<field>`` for the fields of
    the CUDA backend plus :data:`LINK_FIELDS` (and the PCIe throughput with ``pcie=True``),
    for each NVML device ``i``. ``gpu{i}_process_mem_bytes`` is this process's memory on GPU
    ``i``. :meth:`processes` lists who uses each GPU as of the last sample.
    """

    def __init__(self, *, pcie: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = "cpu"
        self.device_index: int | None = None
        self.notes: list[str] = []
        self._clock = clock
        self._lock = threading.Lock()
        self._cpu = CpuBackend()
        self._rates = _Rates()
        self._names: dict[int, str] = {}
        self._procs: dict[int, tuple[GpuProcess, ...]] = {}
        self._gpus: list[Gpu] = []
        self._by_handle: dict[int, int] = {}
        self.nvlinks: list[int] = []
        self._nvml: Any = None
        self._reader: NvmlReader | None = None
        names = self._init_nvml(pcie)
        self.devices: tuple[str, ...] = tuple(names)
        if names:
            self.name = "cuda"
        fields = GPU_FIELDS + LINK_FIELDS + (PCIE_FIELDS if pcie else ())
        self._fields = fields
        self._gpu_keys = [{f: f"gpu{i}_{f}" for f in fields} for i in range(len(names))]
        self._keys = (
            self._cpu.keys + IO_KEYS + tuple(k for keys in self._gpu_keys for k in keys.values())
        )
        self._process = psutil.Process()
        self._closed = False

    # -- the Backend contract -------------------------------------------------------------

    @property
    def keys(self) -> tuple[str, ...]:
        return self._keys

    def sample(self) -> dict[str, float]:
        with self._lock:
            out = dict.fromkeys(self._keys, math.nan)
            if self._closed:
                return out
            out.update(self._cpu.sample())
            out.update(self._io())
            if self._reader is not None:
                for gpu in self._gpus:
                    keys = self._gpu_keys[gpu.index]
                    out.update((keys[f], v) for f, v in self._reader.read(gpu).items())
            return out

    def device_gauges(self, sample: dict[str, float]) -> list[dict[str, float | str]]:
        """One dict per GPU: its name, index, every field of the sample, the NVLink links up,
        and the clock-event reasons that hold its clocks down, in words."""
        gauges: list[dict[str, float | str]] = []
        for i, keys in enumerate(self._gpu_keys):
            mask = sample.get(keys["throttle_mask"], math.nan)
            gauge: dict[str, float | str] = {"name": self.devices[i], "index": float(i)}
            gauge.update((f, sample.get(k, math.nan)) for f, k in keys.items())
            gauge["nvlink_links"] = float(self.nvlinks[i]) if i < len(self.nvlinks) else math.nan
            gauge["throttle"] = ", ".join(decode_throttle(int(mask))) if math.isfinite(mask) else ""
            gauges.append(gauge)
        return gauges

    def processes(self) -> tuple[tuple[GpuProcess, ...], ...]:
        """Per GPU, the processes using it at the last sample, largest memory first."""
        procs = self._procs
        return tuple(procs.get(i, ()) for i in range(len(self.devices)))

    def field_latency_us(self) -> dict[str, float]:
        """Mean wall time of each NVML call so far, in microseconds."""
        with self._lock:
            return self._reader.latency_us() if self._reader is not None else {}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cpu.close()
            if self._nvml is not None:
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()

    # -- internals ------------------------------------------------------------------------

    def _init_nvml(self, pcie: bool) -> list[str]:
        nvml, reason = _nvml.load()
        if nvml is None:
            self.notes.append(f"No GPU fields: {reason}")
            return []
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self.notes.append(f"No GPU fields: nvmlInit failed ({exc}).")
            return []
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self.notes.append(f"No GPU fields: nvmlDeviceGetCount failed ({exc}).")
            count = 0
        self._nvml = nvml
        table = [q for q in queries(nvml, os.getpid(), pcie) if q.name != "processes"]
        table += [self._processes_query(nvml), *_link_queries(nvml)]
        self._reader = NvmlReader(nvml, table, self.notes)
        names = []
        for i in range(count):
            gpu = Gpu(index=i)
            try:
                gpu.handle = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(gpu.handle)
                names.append(name.decode() if isinstance(name, bytes) else str(name))
            except nvml.NVMLError as exc:
                gpu.lost = True
                names.append(f"gpu{i}")
                self.notes.append(f"gpu{i}: NVML cannot open it ({exc}); its fields are NaN.")
            self._by_handle[id(gpu.handle)] = i
            self._gpus.append(gpu)
            self.nvlinks.append(_nvlinks_up(nvml, gpu.handle) if not gpu.lost else 0)
        return names

    def _processes_query(self, nvml: Any) -> Query:
        """The processes on a GPU (compute and graphics), kept for :meth:`processes`; the
        field is this process's memory there (NaN when NVML does not list it)."""
        me = os.getpid()
        calls = [
            getattr(nvml, n)
            for n in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses",
            )
            if hasattr(nvml, n)
        ]

        def read(handle: Any) -> tuple[float, ...]:
            used: dict[int, float] = {}
            for call in calls:
                with contextlib.suppress(nvml.NVMLError):  # graphics: often NotSupported
                    for p in call(handle):
                        mem = p.usedGpuMemory  # None: not reported (Windows WDDM)
                        pid = int(p.pid)
                        value = float(mem) if mem is not None else math.nan
                        used[pid] = used.get(pid, 0.0) + value
            listed = sorted(used.items(), key=lambda kv: -kv[1] if math.isfinite(kv[1]) else 0.0)
            index = self._by_handle.get(id(handle))
            if index is not None:
                self._procs[index] = tuple(
                    GpuProcess(pid, self._name(pid), mem) for pid, mem in listed[:MAX_PROCESSES]
                )
            return (used.get(me, math.nan),)

        return Query("processes", ("process_mem_bytes",), (read,) if calls else ())

    def _name(self, pid: int) -> str:
        name = self._names.get(pid)
        if name is None:
            try:
                name = psutil.Process(pid).name()
            except (psutil.Error, OSError):
                name = "?"  # another PID namespace (a container), or already gone
            if len(self._names) > 4096:  # pids come and go: bounded
                self._names.clear()
            self._names[pid] = name
        return name

    def _io(self) -> dict[str, float]:
        counters: dict[str, float] = {}
        with contextlib.suppress(OSError, RuntimeError, AttributeError):
            disk = psutil.disk_io_counters()
            if disk is not None:
                counters["disk_read_bytes_per_s"] = float(disk.read_bytes)
                counters["disk_write_bytes_per_s"] = float(disk.write_bytes)
        with contextlib.suppress(OSError, RuntimeError, AttributeError):
            net = psutil.net_io_counters()
            counters["net_recv_bytes_per_s"] = float(net.bytes_recv)
            counters["net_sent_bytes_per_s"] = float(net.bytes_sent)
        with contextlib.suppress(psutil.Error, OSError, AttributeError):
            io = self._process.io_counters()  # not on macOS: AttributeError
            counters["process_read_bytes_per_s"] = float(io.read_bytes)
            counters["process_write_bytes_per_s"] = float(io.write_bytes)
        return self._rates.update(counters, self._clock())


def _link_queries(nvml: Any) -> list[Query]:
    def link(h: Any) -> tuple[float, ...]:
        return (
            float(nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            float(nvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
        )

    have = all(
        hasattr(nvml, n)
        for n in ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth")
    )
    return [Query("pcie_link", LINK_FIELDS, (link,) if have else ())]


def _nvlinks_up(nvml: Any, handle: Any) -> int:
    """NVLink links active on a GPU (0 without NVLink); asked once, at construction."""
    if not hasattr(nvml, "nvmlDeviceGetNvLinkState"):
        return 0
    up = 0
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            break  # NotSupported (no NVLink) or past the last link
        up += int(state == getattr(nvml, "NVML_FEATURE_ENABLED", 1))
    return up


__all__ = ["IO_KEYS", "LINK_FIELDS", "GpuProcess", "MachineBackend"]
