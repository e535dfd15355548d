"""The notebook widget of ``nbmonitor.devices()``: one card per GPU (bars and sparklines,
clocks and throttle reasons, PCIe/NVLink, its processes), the machine's and this kernel's CPU,
RAM, disk and network, and the device alerts. A view of DevicesFrames (``machine/watch.py``).

Its one trait is plain JSON (NaN as null), at most a few kB per refresh: the sparklines carry
the last samples of a few keys, not the history; the state is the registry's devices panel
(``ui/panels/devices.py``), sent only when it changed. The ESM is built from
``js/src/devices.js`` into ``nbmonitor/static/devices.js``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

from nbmonitor._engine.frame import DevicesFrame
from nbmonitor.ui.panels.devices import DevicesPanel, panel_state

_STATIC = Path(__file__).resolve().parent.parent / "static"
_MISSING_ESM = """
export default { render({ el }) {
  el.textContent = "nbmonitor: the devices panel front end is not built; run `npm run build` "
    + "in js/ (or `pip install -e .`).";
} };
"""


class _Widget(anywidget.AnyWidget):
    _esm = _STATIC / "devices.js" if (_STATIC / "devices.js").is_file() else _MISSING_ESM
    state = traitlets.Dict().tag(sync=True)


class DevicesDashboard:
    """The live panel of a device watch (a view of it: its watch is the only writer). Display
    it, or leave it last in a cell."""

    def __init__(self) -> None:
        self.widget = _Widget()
        self._state = DevicesPanel()

    def publish(self, frame: DevicesFrame) -> None:
        state = self._state.state(frame)
        if state is not None:  # nothing sent when nothing changed
            self.widget.state = state

    def close(self, frame: DevicesFrame) -> None:
        self.publish(frame)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


def show_panel(panel: DevicesDashboard) -> None:
    """Display ``panel`` in the current cell's output (main thread)."""
    from IPython.display import display

    display(panel.widget)  # type: ignore[no-untyped-call]


__all__ = ["DevicesDashboard", "panel_state", "show_panel"]
