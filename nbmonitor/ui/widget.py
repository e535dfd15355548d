"""The dashboard's anywidget: header, gauges, alerts and one trait per panel.

Its traits are JSON (NaN sent as null, because JSON has no NaN and jupyter_client warns on it)
whose arrays travel in the binary codec (``codec.py``), so a chart's data is one binary buffer
and never a JSON list. ``panels`` lists the tabs a view shows, in order; ``panel_<name>`` holds
each panel's state, one trait per name in ``nbmonitor.ui.panels.NAMES``, so that a publish
sends only the panels that changed. The ESM and CSS are built from ``js/`` into
``nbmonitor/static`` (esbuild, uPlot bundled: nothing is fetched at run time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

from nbmonitor.ui.panels import NAMES

_STATIC = Path(__file__).resolve().parent.parent / "static"

# A source checkout where nobody ran the JS build still imports; the widget says what to do
# instead of raising FileNotFoundError at import time (anywidget's behaviour for a missing file).
_MISSING_ESM = """
export default { render({ el }) {
  el.textContent = "nbmonitor: the dashboard front end is not built; run `npm run build` in js/ "
    + "(or `pip install -e .`).";
} };
"""


def asset(name: str, fallback: str) -> Path | str:
    path = _STATIC / name
    return path if path.is_file() else fallback


class _Widget(anywidget.AnyWidget):
    _esm = asset("widget.js", _MISSING_ESM)
    _css = asset("widget.css", "")

    header = traitlets.Dict().tag(sync=True)
    system = traitlets.Dict().tag(sync=True)
    devices: traitlets.List[dict[str, object]] = traitlets.List().tag(sync=True)
    alerts: traitlets.List[dict[str, object]] = traitlets.List().tag(sync=True)
    errors: traitlets.List[str] = traitlets.List().tag(sync=True)
    panels: traitlets.List[str] = traitlets.List().tag(sync=True)
    # The steering bar (steer_controls.bar_state): shown on a live run's dashboard only.
    steer = traitlets.Dict().tag(sync=True)


# One Dict trait per panel, named from the registry: adding a panel adds its trait.
DashboardWidget: type[_Widget] = type(
    "DashboardWidget",
    (_Widget,),
    {
        "__doc__": "Synced state of a dashboard, written by its view (Dashboard, RanksDashboard).",
        "__module__": __name__,
        **{f"panel_{name}": traitlets.Dict().tag(sync=True) for name in NAMES},
    },
)


def set_panel(widget: _Widget, name: str, state: dict[str, Any]) -> None:
    setattr(widget, f"panel_{name}", state)


def get_panel(widget: _Widget, name: str) -> dict[str, Any]:
    value: dict[str, Any] = getattr(widget, f"panel_{name}")
    return value
