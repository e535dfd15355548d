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
from typing import Any

import torch

from nbmonitor._clock_events import THROTTLE_REASONS, THROTTLING_MASK, decode_throttle
from nbmonitor.backends import _nvml
from nbmonitor.backends._allocator import ALLOCATOR_KEYS, AllocatorReader
from nbmonitor.backends._nvml_queries import GPU_FIELDS, PCIE_FIELDS, Gpu, queries
from nbmonitor.backends._nvml_reader import NvmlReader
from nbmonitor.backends.cpu import CPU_KEYS, CpuBackend


class CudaBackend:
    """CPU/RAM (from :class:`CpuBackend`), NVML fields per visible GPU and allocator stats.

    Keys: the CPU keys; ``gpu{i}_<field>`` for every field in ``GPU_FIELDS`` (and
    ``PCIE_FIELDS`` when ``pcie=True``) for each torch-visible device ``i``; ``ALLOCATOR_KEYS``
    for the training device ``device_index``.

    ``cuda_peak_allocated_bytes`` is torch's peak counter as it stands: the peak since the
    process started (or since the user's own ``reset_peak_memory_stats``). nbmonitor never
    resets it: the counter is process-wide, and code that reads
    ``torch.cuda.max_memory_allocated()`` itself would get nbmonitor's windows instead of its
    own. The peak of each sampling interval (``cuda_interval_peak_bytes``) comes from deltas
    of the counters instead (``_allocator.py``).

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
        notes: list[str] | None = None,
    ) -> None:
        self.device_index: int | None = device_index
        self.pcie = pcie
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
        self._gpus: list[Gpu] = []
        self._reader: NvmlReader | None = None
        self._init_ns = 0
        self._allocator_noted = False
        self._allocator_reader: AllocatorReader | None = None

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
            out.update(self._allocator(out))
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
            out = {"nvml_init": self._init_ns / 1e3} if self._init_ns else {}
            if self._reader is not None:
                out.update(self._reader.latency_us())
            return out

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
        self._init_ns = time.perf_counter_ns() - start
        self._nvml = nvml
        self._reader = NvmlReader(nvml, queries(nvml, os.getpid(), self.pcie), self.notes)
        for i in range(self.gpu_count):
            gpu = Gpu(index=i)
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

    def _sample_gpu(self, gpu: Gpu) -> dict[str, float]:
        keys = self._gpu_keys[gpu.index]
        assert self._reader is not None
        return {keys[f]: v for f, v in self._reader.read(gpu).items()}

    def _allocator(self, sampled: dict[str, float]) -> dict[str, float]:
        # memory_stats() reads the caching allocator's counters on the host: no device sync.
        index = self.device_index if self.device_index is not None else 0
        try:
            stats = torch.cuda.memory_stats(index)
            reader = self._allocator_reader
            if reader is None:  # once, on the sampler thread
                total = torch.cuda.get_device_properties(index).total_memory
                reader = self._allocator_reader = AllocatorReader(float(total))
        except (RuntimeError, AssertionError, AttributeError) as exc:
            if not self._allocator_noted:
                self._allocator_noted = True
                self.notes.append(f"torch.cuda.memory_stats failed ({exc}); allocator stats NaN.")
            return {}
        return reader.read(stats, sampled.get(f"gpu{index}_process_mem_bytes", math.nan))


__all__ = [
    "ALLOCATOR_KEYS",
    "GPU_FIELDS",
    "PCIE_FIELDS",
    "THROTTLE_REASONS",
    "THROTTLING_MASK",
    "CudaBackend",
    "decode_throttle",
]
