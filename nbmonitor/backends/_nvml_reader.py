"""Reading one GPU's NVML fields by the query table (``_nvml_queries``), with what a run and
the machine view share: an older call tried when the driver lacks the newer one, a field that
answers NotSupported never asked again, a lost device turned to NaN with a note, and the mean
latency of each call. No torch: the CUDA backend and the machine backend both use it."""

from __future__ import annotations

import time
from typing import Any

from nbmonitor.backends import _nvml
from nbmonitor.backends._nvml_queries import Gpu, Query


class NvmlReader:
    """Runs ``queries`` on a GPU's handle; problems worth telling go to ``notes``.

    Not thread-safe on its own: its backend calls it under the backend's lock.
    """

    def __init__(self, nvml: Any, queries: list[Query], notes: list[str]) -> None:
        self.nvml = nvml
        self.queries = queries
        self.notes = notes
        self.latency_ns: dict[str, list[int]] = {}  # name -> [total ns, calls]

    def time(self, name: str, start_ns: int) -> None:
        slot = self.latency_ns.setdefault(name, [0, 0])
        slot[0] += time.perf_counter_ns() - start_ns
        slot[1] += 1

    def latency_us(self) -> dict[str, float]:
        """Mean wall time of each NVML call so far, in microseconds."""
        return {
            name: total / calls / 1e3 for name, (total, calls) in self.latency_ns.items() if calls
        }

    def read(self, gpu: Gpu) -> dict[str, float]:
        """``{field: value}`` of every query that answered; ``{}`` once the GPU is lost."""
        out: dict[str, float] = {}
        if gpu.lost:
            return out
        try:
            for query in self.queries:
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
                    out[f] = v
        except _GpuLost as exc:
            gpu.lost = True
            gpu.handle = None
            self.notes.append(f"gpu{gpu.index}: lost ({exc.__cause__}); its fields are NaN now.")
            return {}
        return out

    def _read(self, gpu: Gpu, query: Query) -> tuple[float, ...] | None:
        nvml = self.nvml
        while True:
            index = gpu.variant.get(query.name, 0)
            if index >= len(query.variants):
                gpu.disabled.add(query.name)  # this pynvml/driver has no such call
                return None
            start = time.perf_counter_ns()
            try:
                values = query.variants[index](gpu.handle)
            except nvml.NVMLError as exc:
                self.time(query.name, start)
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
            self.time(query.name, start)
            return values


class _GpuLost(Exception):
    pass
