"""The machine view's reading of a DevicesFrame, shared by the notebook panel
(``devices.py``), the terminal app (``tui/``) and ``nbmonitor top --once``: which values to
show per GPU, how to write them, and how they grade against the device rules' thresholds
(``ok``, ``warn`` a little below an alert, ``alert`` where the rule fires)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from nbmonitor._engine.frame import DevicesFrame, GpuProcess

Grade = str  # "ok" | "warn" | "alert" | "none" (no reading)

# A value this close to its alert threshold is shown as a warning.
WARN_BELOW_C = 10.0
WARN_BELOW_FRACTION = 0.1
# The clock-event reasons that the throttling rule calls a warning (not the power cap).
_HARD = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

# The sparklines: per GPU and for the machine, the sample keys drawn.
GPU_SPARKS = ("util_percent", "mem_used_bytes", "temperature_c", "power_w")
MACHINE_SPARKS = ("cpu_percent", "ram_used_bytes", "process_cpu_percent", "process_rss_bytes")


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def si_bytes(value: float) -> str:
    """``12.3 GiB``; ``-`` for no reading."""
    if not math.isfinite(value):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"  # pragma: no cover


def rate(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{si_bytes(value)}/s"


def fixed(value: float, unit: str = "", digits: int = 0) -> str:
    return "-" if not math.isfinite(value) else f"{value:.{digits}f}{unit}"


def grade_temperature(value: float, threshold_c: float) -> Grade:
    if not math.isfinite(value):
        return "none"
    if value >= threshold_c:
        return "alert"
    return "warn" if value >= threshold_c - WARN_BELOW_C else "ok"


def grade_memory(used: float, total: float, fraction: float) -> Grade:
    if not (math.isfinite(used) and math.isfinite(total) and total > 0):
        return "none"
    share = used / total
    if share >= fraction:
        return "alert"
    return "warn" if share >= fraction - WARN_BELOW_FRACTION else "ok"


def grade_throttle(reasons: str) -> Grade:
    names = [r.strip() for r in reasons.split(",") if r.strip()]
    if any(n in _HARD for n in names):
        return "alert"
    return "warn" if "sw_power_cap" in names else "ok"


@dataclass(frozen=True)
class GpuRow:
    """One GPU as the machine views show it: values, words and grades."""

    index: int
    name: str
    values: Mapping[str, float]
    throttle: str
    grades: Mapping[str, Grade]
    processes: tuple[GpuProcess, ...]


def gpu_rows(frame: DevicesFrame) -> list[GpuRow]:
    t = frame.thresholds
    rows = []
    for i, gauge in enumerate(frame.frame.devices):
        values = {k: _num(v) for k, v in gauge.items() if not isinstance(v, str)}
        throttle = str(gauge.get("throttle", ""))
        grades = {
            "temperature_c": grade_temperature(
                values.get("temperature_c", math.nan), t.get("temperature_c", math.inf)
            ),
            "mem_used_bytes": grade_memory(
                values.get("mem_used_bytes", math.nan),
                values.get("mem_total_bytes", math.nan),
                t.get("memory_fraction", math.inf),
            ),
            "throttle": grade_throttle(throttle),
        }
        index = int(values.get("index", i)) if math.isfinite(values.get("index", i)) else i
        rows.append(
            GpuRow(
                index=index,
                name=str(gauge.get("name", f"gpu{i}")),
                values=values,
                throttle=throttle,
                grades=grades,
                processes=frame.processes[i] if i < len(frame.processes) else (),
            )
        )
    return rows


def machine_values(frame: DevicesFrame) -> dict[str, float]:
    """The machine's and this process's latest values (no GPU keys)."""
    return {k: v for k, v in frame.frame.latest.items() if not k.startswith("gpu")}


__all__ = [
    "GPU_SPARKS",
    "MACHINE_SPARKS",
    "GpuRow",
    "fixed",
    "gpu_rows",
    "grade_memory",
    "grade_temperature",
    "grade_throttle",
    "machine_values",
    "rate",
    "si_bytes",
]
