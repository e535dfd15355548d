"""The notebook panel of ``nbmonitor.devices()``: one card per GPU (bars and sparklines,
clocks and throttle reasons, PCIe/NVLink, its processes), the machine's and this kernel's CPU,
RAM, disk and network, and the device alerts. A view of DevicesFrames (``machine/watch.py``).

Its one trait is plain JSON (NaN as null), at most a few kB per refresh: the sparklines carry
the last ``SPARK_POINTS`` samples of a few keys, not the history. The ESM is built from
``js/src/devices.js`` into ``nbmonitor/static/devices.js``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from nbmonitor._engine.devices_frame import DevicesFrame
from nbmonitor.ui.machine import GPU_SPARKS, MACHINE_SPARKS, gpu_rows, machine_values

SPARK_POINTS = 120
ALERTS_SHOWN = 8
_STATIC = Path(__file__).resolve().parent.parent / "static"
_MISSING_ESM = """
export default { render({ el }) {
  el.textContent = "nbmonitor: the devices panel front end is not built; run `npm run build` "
    + "in js/ (or `pip install -e .`).";
} };
"""


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


class _Widget(anywidget.AnyWidget):
    _esm = _STATIC / "devices.js" if (_STATIC / "devices.js").is_file() else _MISSING_ESM
    state = traitlets.Dict().tag(sync=True)


class DevicesPanel:
    """The live panel of a device watch (a view of it: its watch is the only writer). Display
    it, or leave it last in a cell."""

    def __init__(self) -> None:
        self.widget = _Widget()

    def publish(self, frame: DevicesFrame) -> None:
        self.widget.state = panel_state(frame)

    def close(self, frame: DevicesFrame) -> None:
        self.widget.state = panel_state(frame)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


def show_panel(panel: DevicesPanel) -> None:
    """Display ``panel`` in the current cell's output (main thread)."""
    from IPython.display import display

    display(panel.widget)  # type: ignore[no-untyped-call]


__all__ = ["SPARK_POINTS", "DevicesPanel", "panel_state", "show_panel"]
