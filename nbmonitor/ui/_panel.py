"""The anywidget half of the dashboard: header, gauges, alerts and the per-layer panel.

Its traits are plain JSON (NaN sent as null, because JSON has no NaN and jupyter_client warns on
it) plus two binary buffers for the layer heatmap. The ESM and CSS are built from ``js/`` into
``nbmonitor/static`` by hatch-jupyter-builder.
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets

_STATIC = Path(__file__).resolve().parent.parent / "static"

# A source checkout where nobody ran the JS build still imports; the panel says what to do
# instead of raising FileNotFoundError at import time (anywidget's behaviour for a missing file).
_MISSING_ESM = """
export default { render({ el }) {
  el.textContent = "nbmonitor: the dashboard front end is not built; run `npm run build` in js/ "
    + "(or `pip install -e .`).";
} };
"""


def _asset(name: str, fallback: str) -> Path | str:
    path = _STATIC / name
    return path if path.is_file() else fallback


class Panel(anywidget.AnyWidget):
    """Synced state of the dashboard panel; ``nbmonitor.ui.Dashboard`` is its only writer."""

    _esm = _asset("widget.js", _MISSING_ESM)
    _css = _asset("widget.css", "")

    header = traitlets.Dict().tag(sync=True)
    system = traitlets.Dict().tag(sync=True)
    devices: traitlets.List[dict[str, object]] = traitlets.List().tag(sync=True)
    alerts: traitlets.List[dict[str, object]] = traitlets.List().tag(sync=True)
    errors: traitlets.List[str] = traitlets.List().tag(sync=True)
    # {names, n_layers, n_steps, table}; {} when the frame has no per-layer data.
    layers = traitlets.Dict().tag(sync=True)
    # float32 row-major [n_layers x n_steps] log10 grad norm, and float64 column steps.
    layers_grid = traitlets.Bytes(b"").tag(sync=True)
    layers_steps = traitlets.Bytes(b"").tag(sync=True)
