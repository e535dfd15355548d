"""The devices panel: every GPU of the machine (values, grades, processes, sparklines), the
machine and this kernel, the device alerts, from a ``DevicesFrame`` (``nbmonitor.devices()``).
``js/src/panels/devices.js`` draws it: in the devices widget (``ui/devices.py``), or in any
view of the registry that lists it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from nbmonitor._engine.frame import DevicesFrame
from nbmonitor.ui.machine import GPU_SPARKS, MACHINE_SPARKS, gpu_rows, machine_values
from nbmonitor.ui.panels.base import Unchanged

SPARK_POINTS = 120
ALERTS_SHOWN = 8


def _json(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _spark(values: Any) -> list[float | None]:
    return [_json(float(v)) for v in values[-SPARK_POINTS:]]


def panel_state(frame: DevicesFrame) -> dict[str, object]:
    """The panel's trait for ``frame``: what the JS draws, NaN as null."""
    history, inner = frame.history, frame.frame
    gpus = []
    for row in gpu_rows(frame):
        prefix = f"gpu{row.index}_"
        gpus.append(
            {
                "index": row.index,
                "name": row.name,
                "values": {k: _json(v) for k, v in row.values.items()},
                "throttle": row.throttle,
                "grades": dict(row.grades),
                "processes": [
                    {"pid": p.pid, "name": p.name, "used_bytes": _json(p.used_bytes)}
                    for p in row.processes
                ],
                "spark": {
                    k: _spark(history[prefix + k]) for k in GPU_SPARKS if prefix + k in history
                },
            }
        )
    return {
        "host": frame.host,
        "status": inner.status,
        "interval": frame.interval,
        "elapsed_s": inner.elapsed_s,
        "run_dir": frame.run_dir,
        "machine": {k: _json(v) for k, v in machine_values(frame).items()},
        "spark": {k: _spark(history[k]) for k in MACHINE_SPARKS if k in history},
        "gpus": gpus,
        "alerts": [
            {k: v for k, v in dataclasses.asdict(a).items() if k in ("severity", "message", "rule")}
            # The backend's notes (NVML missing, a GPU lost) are shown once, as notes.
            for a in reversed([a for a in inner.alerts if a.rule != "backend"][-ALERTS_SHOWN:])
        ],
        "errors": list(inner.errors),
        "notes": list(frame.notes),
        "thresholds": dict(frame.thresholds),
    }


class DevicesPanel:
    """The registry's devices panel: ``state`` is :func:`panel_state`, None when unchanged."""

    name: ClassVar[str] = "devices"

    def __init__(self) -> None:
        self._unchanged = Unchanged()

    def state(self, frame: DevicesFrame) -> dict[str, Any] | None:
        return self._unchanged.filter(panel_state(frame))


__all__ = ["ALERTS_SHOWN", "SPARK_POINTS", "DevicesPanel", "panel_state"]
