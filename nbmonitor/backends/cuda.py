"""NVIDIA GPUs: NVML (nvidia-ml-py) per visible device plus torch.cuda allocator statistics.

Lifecycle, nvitop style: construction only counts devices; ``pynvml`` is imported and
``nvmlInit`` runs once, on the first ``sample()``, which happens on the sampler thread, so
attaching never waits on the driver. A field the device cannot report (NotSupported,
NoPermission) is asked once and then stays NaN; a device that falls off the bus (GpuIsLost,
Unknown) turns its fields to NaN and leaves a note. ``sample()`` never raises for NVML.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from nbmonitor._clock_events import THROTTLE_REASONS, THROTTLING_MASK, decode_throttle
from nbmonitor.backends import _nvml
from nbmonitor.backends.cpu import CPU_KEYS, CpuBackend

GPU_FIELDS = (
    "util_percent",
    "mem_util_percent",
    "mem_used_bytes",
    "mem_total_bytes",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "energy_j",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "fan_percent",
    "throttle_mask",
    "process_mem_bytes",
)
PCIE_FIELDS = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")
ALLOCATOR_KEYS = (
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "cuda_peak_allocated_bytes",
    "cuda_alloc_retries",
    "cuda_ooms",
)
_ALLOCATOR_SOURCES = {
    "cuda_allocated_bytes": "allocated_bytes.all.current",
    "cuda_reserved_bytes": "reserved_bytes.all.current",
    "cuda_peak_allocated_bytes": "allocated_bytes.all.peak",
    "cuda_alloc_retries": "num_alloc_retries",
    "cuda_ooms": "num_ooms",
}

Reader = Callable[[Any], tuple[float, ...]]


@dataclass(frozen=True)
class _Query:
    """One NVML call and the fields it fills; ``variants`` newest API first."""

    name: str
    fields: tuple[str, ...]
    variants: tuple[Reader, ...]


@dataclass
class _Gpu:
    index: int  # torch index, the i in gpu{i}_
    handle: Any = None
    lost: bool = False
    disabled: set[str] = field(default_factory=set)  # queries that said NotSupported
    variant: dict[str, int] = field(default_factory=dict)  # which variant works on this driver
    energy_base_mj: float | None = None
    failed: set[str] = field(default_factory=set)  # queries already noted as failing


def _queries(nvml: Any, pid: int, pcie: bool) -> list[_Query]:
    """The calls made per GPU per sample, with older fallbacks only where a call was renamed."""

    def have(*names: str) -> bool:
        return all(hasattr(nvml, n) for n in names)

    def utilization(h: Any) -> tuple[float, ...]:
        rates = nvml.nvmlDeviceGetUtilizationRates(h)
        return float(rates.gpu), float(rates.memory)

    def memory_v2(h: Any) -> tuple[float, ...]:
        # v2 reports "used" without the driver's reserved memory, matching nvidia-smi.
        info = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
        return float(info.used), float(info.total)

    def memory_v1(h: Any) -> tuple[float, ...]:
        info = nvml.nvmlDeviceGetMemoryInfo(h)
        return float(info.used), float(info.total)

    def temperature_v(h: Any) -> tuple[float, ...]:
        return (float(nvml.nvmlDeviceGetTemperatureV(h, nvml.NVML_TEMPERATURE_GPU)),)

    def temperature(h: Any) -> tuple[float, ...]:
        return (float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),)

    def processes(h: Any) -> tuple[float, ...]:
        # NaN rather than 0 when our PID is absent: in a container NVML lists host PIDs, so
        # absence does not prove we use no memory there.
        used = [
            p.usedGpuMemory for p in nvml.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == pid
        ]
        if not used or any(u is None for u in used):  # None: not reported (Windows WDDM)
            return (math.nan,)
        return (float(sum(used)),)

    def one(fn_name: str, scale: float = 1.0, *args_names: str) -> Reader:
        def read(h: Any) -> tuple[float, ...]:
            args = [getattr(nvml, a) for a in args_names]
            return (float(getattr(nvml, fn_name)(h, *args)) * scale,)

        return read

    def pick(*candidates: tuple[bool, Reader]) -> tuple[Reader, ...]:
        return tuple(reader for ok, reader in candidates if ok)

    event = "nvmlDeviceGetCurrentClocksEventReasons"
    throttle = "nvmlDeviceGetCurrentClocksThrottleReasons"  # deprecated name, drivers < 535
    out = [
        _Query(
            "utilization",
            ("util_percent", "mem_util_percent"),
            pick((have("nvmlDeviceGetUtilizationRates"), utilization)),
        ),
        _Query(
            "memory",
            ("mem_used_bytes", "mem_total_bytes"),
            pick(
                (have("nvmlDeviceGetMemoryInfo", "nvmlMemory_v2"), memory_v2),
                (have("nvmlDeviceGetMemoryInfo"), memory_v1),
            ),
        ),
        _Query(
            "temperature",
            ("temperature_c",),
            pick(
                (have("nvmlDeviceGetTemperatureV", "NVML_TEMPERATURE_GPU"), temperature_v),
                (have("nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU"), temperature),
            ),
        ),
        # NVML reports milliwatts; on Ampere and later this is a one-second average.
        _Query(
            "power",
            ("power_w",),
            pick((have("nvmlDeviceGetPowerUsage"), one("nvmlDeviceGetPowerUsage", 1e-3))),
        ),
        _Query(
            "power_limit",
            ("power_limit_w",),
            pick(
                (
                    have("nvmlDeviceGetEnforcedPowerLimit"),
                    one("nvmlDeviceGetEnforcedPowerLimit", 1e-3),
                )
            ),
        ),
        # Raw millijoules since driver load; made relative to the first reading in sample().
        _Query(
            "energy",
            ("energy_j",),
            pick(
                (
                    have("nvmlDeviceGetTotalEnergyConsumption"),
                    one("nvmlDeviceGetTotalEnergyConsumption"),
                )
            ),
        ),
        _Query(
            "sm_clock",
            ("sm_clock_mhz",),
            pick(
                (
                    have("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
                    one("nvmlDeviceGetClockInfo", 1.0, "NVML_CLOCK_SM"),
                )
            ),
        ),
        _Query(
            "mem_clock",
            ("mem_clock_mhz",),
            pick(
                (
                    have("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"),
                    one("nvmlDeviceGetClockInfo", 1.0, "NVML_CLOCK_MEM"),
                )
            ),
        ),
        _Query(
            "fan",
            ("fan_percent",),
            pick((have("nvmlDeviceGetFanSpeed"), one("nvmlDeviceGetFanSpeed"))),
        ),
        _Query(
            "throttle",
            ("throttle_mask",),
            pick((have(event), one(event)), (have(throttle), one(throttle))),
        ),
        _Query(
            "processes",
            ("process_mem_bytes",),
            pick((have("nvmlDeviceGetComputeRunningProcesses"), processes)),
        ),
    ]
    if pcie:
        # Blocks about 20 ms per counter inside the driver: opt-in only. NVML gives KB/s.
        for direction, counter in (
            ("tx", "NVML_PCIE_UTIL_TX_BYTES"),
            ("rx", "NVML_PCIE_UTIL_RX_BYTES"),
        ):
            out.append(
                _Query(
                    f"pcie_{direction}",
                    (f"pcie_{direction}_bytes_per_s",),
                    pick(
                        (
                            have("nvmlDeviceGetPcieThroughput", counter),
                            one("nvmlDeviceGetPcieThroughput", 1024.0, counter),
                        )
                    ),
                )
            )
    return out


class _GpuLost(Exception):
    pass


class CudaBackend:
    """CPU/RAM (from :class:`CpuBackend`), NVML fields per visible GPU and allocator stats.

    Keys: the CPU keys; ``gpu{i}_<field>`` for every field in ``GPU_FIELDS`` (and
    ``PCIE_FIELDS`` when ``pcie=True``) for each torch-visible device ``i``; ``ALLOCATOR_KEYS``
    for the training device ``device_index``.

    ``cuda_peak_allocated_bytes`` is the peak *since the previous sample*: the peak counter is
    reset after each reading (torchtitan resets per log window the same way), so a spike in one
    step shows up against that step instead of hiding under an all-time maximum. That reset is
    process-wide: code that reads ``torch.cuda.max_memory_allocated()`` itself should pass
    ``reset_peak=False``, which reports the peak since the process started (or its own reset).

    ``use_nvml=False`` (nvidia-ml-py not installed) keeps the allocator stats and leaves every
    NVML field NaN; why is in ``notes``.
    """

    name = "cuda"

    def __init__(
        self,
        device_index: int = 0,
        *,
        pcie: bool = False,
        use_nvml: bool = True,
        reset_peak: bool = True,
        notes: list[str] | None = None,
    ) -> None:
        self.device_index: int | None = device_index
        self.pcie = pcie
        self.reset_peak = reset_peak
        self.notes: list[str] = list(notes or [])
        self._cpu = CpuBackend()
        # device_count() asks NVML through torch's own loader and does not initialise CUDA.
        self.gpu_count = int(torch.cuda.device_count())
        fields = GPU_FIELDS + (PCIE_FIELDS if pcie else ())
        self._gpu_keys = [{f: f"gpu{i}_{f}" for f in fields} for i in range(self.gpu_count)]
        self._keys = (
            CPU_KEYS + tuple(k for keys in self._gpu_keys for k in keys.values()) + ALLOCATOR_KEYS
        )
        self._devices: tuple[str, ...] | None = None
        self._lock = threading.Lock()
        # "pending" until the first sample; then "ready", "off" (no NVML) or "closed".
        self._state = "pending" if use_nvml else "off"
        self._nvml: Any = None
        self._gpus: list[_Gpu] = []
        self._queries: list[_Query] = []
        self._latency_ns: dict[str, list[int]] = {}  # name -> [total ns, calls]
        self._allocator_noted = False

    # -- the Backend contract -------------------------------------------------------------

    @property
    def keys(self) -> tuple[str, ...]:
        return self._keys

    @property
    def devices(self) -> tuple[str, ...]:
        """GPU names by torch index, read on first access (torch initialises CUDA for it)."""
        if self._devices is None:
            names = []
            for i in range(self.gpu_count):
                try:
                    names.append(str(torch.cuda.get_device_name(i)))
                except (RuntimeError, AssertionError, AttributeError):
                    names.append(f"cuda:{i}")
            self._devices = tuple(names)
        return self._devices

    @devices.setter
    def devices(self, value: tuple[str, ...]) -> None:
        self._devices = tuple(value)

    def sample(self) -> dict[str, float]:
        with self._lock:
            out = dict.fromkeys(self._keys, math.nan)
            out.update(self._cpu.sample())
            if self._state == "pending":
                self._init_nvml()
            if self._state == "ready":
                for gpu in self._gpus:
                    out.update(self._sample_gpu(gpu))
            out.update(self._allocator())
            return out

    def close(self) -> None:
        with self._lock:
            if self._state == "ready":
                # An error means it was already shut down elsewhere: nothing left to release.
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()
            self._state = "closed"
            self._cpu.close()

    # -- extras ---------------------------------------------------------------------------

    def field_latency_us(self) -> dict[str, float]:
        """Mean wall time of each NVML call (and ``nvml_init``) so far, in microseconds."""
        with self._lock:
            return {
                name: total / calls / 1e3
                for name, (total, calls) in self._latency_ns.items()
                if calls
            }

    def device_gauges(self, sample: dict[str, float]) -> list[dict[str, float | str]]:
        """One dict per GPU for the dashboard's gauges."""
        gauges: list[dict[str, float | str]] = []
        for i, keys in enumerate(self._gpu_keys):
            mask = sample.get(keys["throttle_mask"], math.nan)
            gauges.append(
                {
                    "name": self.devices[i] if i < len(self.devices) else f"cuda:{i}",
                    "index": float(i),
                    **{
                        f: sample.get(keys[f], math.nan)
                        for f in (
                            "util_percent",
                            "mem_used_bytes",
                            "mem_total_bytes",
                            "temperature_c",
                            "power_w",
                            "power_limit_w",
                        )
                    },
                    "throttle": ", ".join(decode_throttle(int(mask)))
                    if math.isfinite(mask)
                    else "",
                }
            )
        return gauges

    # -- internals ------------------------------------------------------------------------

    def _time(self, name: str, start_ns: int) -> None:
        slot = self._latency_ns.setdefault(name, [0, 0])
        slot[0] += time.perf_counter_ns() - start_ns
        slot[1] += 1

    def _init_nvml(self) -> None:
        self._state = "off"  # unless everything below works
        nvml, reason = _nvml.load()
        if nvml is None:
            self.notes.append(f"NVML fields are NaN: {reason}")
            return
        start = time.perf_counter_ns()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self.notes.append(
                f"NVML fields are NaN: nvmlInit failed ({exc}); torch.cuda memory stats still work."
            )
            return
        self._time("nvml_init", start)
        self._nvml = nvml
        self._queries = _queries(nvml, os.getpid(), self.pcie)
        for i in range(self.gpu_count):
            gpu = _Gpu(index=i)
            try:
                gpu.handle, how = _nvml.handle_for(nvml, i, self._torch_uuid(i))
            except nvml.NVMLError as exc:
                gpu.lost = True
                self.notes.append(f"gpu{i}: no NVML device matches torch device {i} ({exc}).")
            else:
                if not how.startswith("uuid"):  # worth knowing: index mapping can be wrong
                    self.notes.append(f"gpu{i}: NVML device by {how}.")
            self._gpus.append(gpu)
        self._state = "ready"

    @staticmethod
    def _torch_uuid(index: int) -> str | None:
        try:
            uuid = torch.cuda.get_device_properties(index).uuid
        except (RuntimeError, AssertionError, AttributeError):
            return None  # older torch: fall back to parsing CUDA_VISIBLE_DEVICES
        return str(uuid) or None

    def _sample_gpu(self, gpu: _Gpu) -> dict[str, float]:
        keys = self._gpu_keys[gpu.index]
        out: dict[str, float] = {}
        if gpu.lost:
            return out
        try:
            for query in self._queries:
                if query.name in gpu.disabled:
                    continue
                values = self._read(gpu, query)
                if values is None:
                    continue
                if query.name == "energy":
                    if gpu.energy_base_mj is None:
                        gpu.energy_base_mj = values[0]
                    values = ((values[0] - gpu.energy_base_mj) / 1e3,)
                for f, v in zip(query.fields, values, strict=True):
                    out[keys[f]] = v
        except _GpuLost as exc:
            gpu.lost = True
            gpu.handle = None
            self.notes.append(f"gpu{gpu.index}: lost ({exc.__cause__}); its fields are NaN now.")
            return {}
        return out

    def _read(self, gpu: _Gpu, query: _Query) -> tuple[float, ...] | None:
        nvml = self._nvml
        while True:
            index = gpu.variant.get(query.name, 0)
            if index >= len(query.variants):
                gpu.disabled.add(query.name)  # this pynvml/driver has no such call
                return None
            start = time.perf_counter_ns()
            try:
                values = query.variants[index](gpu.handle)
            except nvml.NVMLError as exc:
                self._time(query.name, start)
                if _nvml.function_missing(nvml, exc) and index + 1 < len(query.variants):
                    gpu.variant[query.name] = index + 1  # older driver: use the older call
                    continue
                kind = _nvml.classify(nvml, exc)
                if kind == "lost":
                    raise _GpuLost() from exc
                if kind == "unsupported":
                    gpu.disabled.add(query.name)
                elif query.name not in gpu.failed:
                    gpu.failed.add(query.name)
                    self.notes.append(f"gpu{gpu.index}: {query.name} failed ({exc}); NaN.")
                return None
            self._time(query.name, start)
            return values

    def _allocator(self) -> dict[str, float]:
        # memory_stats() reads the caching allocator's counters on the host: no device sync.
        try:
            stats = torch.cuda.memory_stats(self.device_index)
            if self.reset_peak:
                torch.cuda.reset_peak_memory_stats(self.device_index)
        except (RuntimeError, AssertionError, AttributeError) as exc:
            if not self._allocator_noted:
                self._allocator_noted = True
                self.notes.append(f"torch.cuda.memory_stats failed ({exc}); allocator stats NaN.")
            return {}
        return {
            key: float(stats[src]) if src in stats else math.nan
            for key, src in _ALLOCATOR_SOURCES.items()
        }


__all__ = [
    "ALLOCATOR_KEYS",
    "GPU_FIELDS",
    "PCIE_FIELDS",
    "THROTTLE_REASONS",
    "THROTTLING_MASK",
    "CudaBackend",
    "decode_throttle",
]
