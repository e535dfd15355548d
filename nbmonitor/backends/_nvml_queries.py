"""The NVML calls made per GPU per sample, declared as a table (nvitop style): which fields
each call fills, and older variants only where NVML renamed a call. ``CudaBackend`` runs them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
Reader = Callable[[Any], tuple[float, ...]]


@dataclass(frozen=True)
class Query:
    """One NVML call and the fields it fills; ``variants`` newest API first."""

    name: str
    fields: tuple[str, ...]
    variants: tuple[Reader, ...]


@dataclass
class Gpu:
    index: int  # torch index, the i in gpu{i}_
    handle: Any = None
    lost: bool = False
    disabled: set[str] = field(default_factory=set)  # queries that said NotSupported
    variant: dict[str, int] = field(default_factory=dict)  # which variant works on this driver
    energy_base_mj: float | None = None
    failed: set[str] = field(default_factory=set)  # queries already noted as failing


def queries(nvml: Any, pid: int, pcie: bool) -> list[Query]:
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
        Query(
            "utilization",
            ("util_percent", "mem_util_percent"),
            pick((have("nvmlDeviceGetUtilizationRates"), utilization)),
        ),
        Query(
            "memory",
            ("mem_used_bytes", "mem_total_bytes"),
            pick(
                (have("nvmlDeviceGetMemoryInfo", "nvmlMemory_v2"), memory_v2),
                (have("nvmlDeviceGetMemoryInfo"), memory_v1),
            ),
        ),
        Query(
            "temperature",
            ("temperature_c",),
            pick(
                (have("nvmlDeviceGetTemperatureV", "NVML_TEMPERATURE_GPU"), temperature_v),
                (have("nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU"), temperature),
            ),
        ),
        # NVML reports milliwatts; on Ampere and later this is a one-second average.
        Query(
            "power",
            ("power_w",),
            pick((have("nvmlDeviceGetPowerUsage"), one("nvmlDeviceGetPowerUsage", 1e-3))),
        ),
        Query(
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
        Query(
            "energy",
            ("energy_j",),
            pick(
                (
                    have("nvmlDeviceGetTotalEnergyConsumption"),
                    one("nvmlDeviceGetTotalEnergyConsumption"),
                )
            ),
        ),
        Query(
            "sm_clock",
            ("sm_clock_mhz",),
            pick(
                (
                    have("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
                    one("nvmlDeviceGetClockInfo", 1.0, "NVML_CLOCK_SM"),
                )
            ),
        ),
        Query(
            "mem_clock",
            ("mem_clock_mhz",),
            pick(
                (
                    have("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"),
                    one("nvmlDeviceGetClockInfo", 1.0, "NVML_CLOCK_MEM"),
                )
            ),
        ),
        Query(
            "fan",
            ("fan_percent",),
            pick((have("nvmlDeviceGetFanSpeed"), one("nvmlDeviceGetFanSpeed"))),
        ),
        Query(
            "throttle",
            ("throttle_mask",),
            pick((have(event), one(event)), (have(throttle), one(throttle))),
        ),
        Query(
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
                Query(
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
