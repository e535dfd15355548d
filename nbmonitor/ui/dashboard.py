"""The notebook dashboard: the anywidget panel and the bqplot curves in one VBox.

``Dashboard`` is a View: the sampler thread calls ``publish`` (at most a few times a second) and
``close`` once. Each publish holds every widget's sync while it assigns, so a publish sends at
most one message per widget that changed, with a bounded size: scalars, ~2,000-point float32
series, and a bounded heatmap. Keyboard and mouse controls (log/linear, reset zoom) run on the
kernel's main thread and share one lock with ``publish``.
"""

from __future__ import annotations

import contextlib
import html
import math
import threading
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from typing import Any

import ipywidgets as widgets
import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import Alert, Frame, LayerFrame
from nbmonitor.ui._panel import Panel
from nbmonitor.ui.console import clip_summary
from nbmonitor.ui.figures import Curves
from nbmonitor.ui.timeline import Timeline

# The heatmap is the one payload that grows with the model: cap its cells (float32) so a publish
# stays small; columns (steps) are merged by max so a spike survives, rows (layers) are kept.
MAX_HEATMAP_CELLS = 65_536
MAX_HEATMAP_COLUMNS = 240

_HEADER_KEYS = (
    "loss",
    "best_loss",
    "samples_per_s",
    "step_time",
    "tokens_per_s",
    "tflops_per_s",
    "mfu_percent",
    "memory_peak_bytes",
    "memory_limit_bytes",
    "batch_size",
    "batch_fits",
)
_SYSTEM_KEYS = (
    "cpu_percent",
    "process_cpu_percent",
    "ram_used_bytes",
    "ram_total_bytes",
    "process_rss_bytes",
    "energy_per_step_j",
    "energy_per_sample_j",
)


def _num(value: object) -> float | int | None:
    """A JSON-safe number: NaN/inf become None (JSON has no NaN), numpy scalars become Python."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def _json(value: object) -> Any:
    """Recursively make a value JSON-safe for a sync'd trait (tuples become lists)."""
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, bool | int | float | np.integer | np.floating):
        return _num(value)
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [_json(v) for v in value.tolist()]
    if isinstance(value, Iterable):
        return [_json(v) for v in value]
    return str(value)


def _alert(alert: Alert) -> dict[str, Any]:
    return {
        "rule": alert.rule,
        "severity": alert.severity,
        "message": alert.message,
        "step": int(alert.step),
        "layers": list(alert.layers),
    }


def bound_heatmap(
    grid: npt.NDArray[np.float64], steps: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64]]:
    """Merge adjacent columns (max, NaN-aware) until the grid fits the cell budget."""
    rows, cols = grid.shape
    limit = max(1, min(MAX_HEATMAP_COLUMNS, MAX_HEATMAP_CELLS // max(rows, 1)))
    if cols <= limit:
        return np.ascontiguousarray(grid, dtype=np.float32), np.asarray(steps, dtype=np.float64)
    edges = np.linspace(0, cols, limit + 1).astype(np.int64)
    # fmax ignores NaN unless the whole bucket is NaN; -inf marks "no finite value" until then.
    filled = np.where(np.isnan(grid), -np.inf, grid)
    merged = np.maximum.reduceat(filled, edges[:-1], axis=1)
    merged[np.isneginf(merged)] = np.nan
    return merged.astype(np.float32), np.asarray(steps, dtype=np.float64)[edges[1:] - 1]


def _layers_state(layers: LayerFrame) -> tuple[dict[str, Any], bytes, bytes]:
    raw = np.asarray(layers.log10_grad_norm, dtype=np.float64)
    steps = np.asarray(layers.steps, dtype=np.float64)
    if raw.ndim != 2 or raw.shape[0] != len(layers.names) or raw.shape[1] != len(steps):
        grid32, steps64 = np.zeros((0, 0), np.float32), np.zeros(0, np.float64)
    else:
        grid32, steps64 = bound_heatmap(raw, steps)
    meta = {
        "names": list(layers.names),
        "n_layers": int(grid32.shape[0]),
        "n_steps": int(grid32.shape[1]),
        "table": [_json(row) for row in layers.table],
    }
    return meta, grid32.tobytes(), steps64.tobytes()


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}g}"


class Dashboard:
    """Live notebook view of one run. Build it, display it, then feed it Frames."""

    wants_detail = True  # curves and the per-layer panel

    def __init__(self, run: str, backend: str, total_steps: int | None) -> None:
        self.run = run
        self.backend = backend
        self.total_steps = total_steps
        self._lock = threading.Lock()
        self._closed = False
        self._last: Frame | None = None
        self.publishes = 0  # accepted publishes, for tests and the benchmark
        self._handles: list[Any] = []  # IPython DisplayHandles of show(), refreshed by close()

        self._panel = Panel(
            header={
                "run": run,
                "backend": backend,
                "status": "running",
                "step": 0,
                "total_steps": total_steps,
            },
            system={},
            devices=[],
            alerts=[],
            errors=[],
            layers={},
        )
        self._curves = Curves()
        self._timeline = Timeline(self._curves.x_scale)
        self._scale_toggles: dict[str, widgets.ToggleButtons] = {}
        controls: list[widgets.Widget] = []
        for key, label in (("loss", "loss"), ("grad_norm", "grad norm")):
            toggle = widgets.ToggleButtons(
                options=["linear", "log"],
                value=self._curves.mode(key),
                description=label,
                tooltips=[f"{label} on a linear axis", f"{label} on a log axis"],
                style={"button_width": "64px", "description_width": "initial"},
            )
            toggle.observe(lambda change, key=key: self._on_scale(key, change), names="value")
            self._scale_toggles[key] = toggle
            controls.append(toggle)
        reset = widgets.Button(
            description="reset zoom",
            icon="search-minus",
            tooltip="Drag to pan and scroll to zoom the curves; this restores autoscaling.",
            layout=widgets.Layout(width="auto"),
        )
        reset.on_click(lambda _button: self._on_reset())
        controls.append(reset)
        self._controls = widgets.HBox(
            controls, layout=widgets.Layout(flex_flow="row wrap", align_items="center")
        )
        self._box = widgets.VBox(
            [self._panel, self._controls, self._curves.grid, self._timeline.box],
            layout=widgets.Layout(width="100%"),
        )

    # -- View -----------------------------------------------------------------------------------

    @property
    def widget(self) -> widgets.VBox:
        """The top-level widget (display it, or put it in your own layout)."""
        return self._box

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_frame(self) -> Frame | None:
        return self._last

    def publish(self, frame: Frame) -> None:
        """Show ``frame``. Safe from any thread; ignored once the dashboard is closed."""
        with self._lock:
            if self._closed:
                return
            self._apply(frame)

    def close(self, frame: Frame) -> None:
        """Show the final frame as "closed" and stop accepting publishes. Idempotent."""
        with self._lock:
            if self._closed:
                return
            if frame.status != "closed":
                frame = _with_status(frame, "closed")
            self._apply(frame)
            self._closed = True
        self._refresh_displays()

    def on_displayed(self, handle: Any) -> None:
        """Called by ``nbmonitor.ui.show`` with the display handle of the output it created."""
        self._handles.append(handle)

    def _refresh_displays(self) -> None:
        # Re-send the output's bundle so its text/html fallback holds the final state. Only from
        # the main thread: the sampler thread never touches display (DESIGN.md section 1), and
        # mon.close() normally runs in the user's cell.
        if threading.current_thread() is not threading.main_thread():
            return
        for handle in self._handles:
            # A front end gone away must not break close().
            with contextlib.suppress(Exception):
                handle.update(self)

    # -- display --------------------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view, plus a static summary for saved notebooks and nbconvert.

        A notebook reopened without its kernel cannot draw the widget; front ends then fall back
        to text/html, which shows the last state instead of "Loading widget...".
        """
        bundle = self._box._repr_mimebundle_(**kwargs)
        data: dict[str, Any] = dict(bundle[0] if isinstance(bundle, tuple) else bundle)
        data["text/plain"] = self.summary_text()
        data["text/html"] = self.summary_html()
        return data

    def summary_text(self) -> str:
        frame = self._last
        if frame is None:
            return f"nbmonitor dashboard: {self.run} ({self.backend}), no data yet"
        total = f"/{frame.total_steps}" if frame.total_steps else ""
        rates = "".join(f" · {value} {label}" for label, value in _throughput_cells(frame.latest))
        return (
            f"nbmonitor {frame.run} [{frame.status}] step {frame.step}{total}"
            f" · loss {_fmt(frame.latest.get('loss'))}{rates} · {_fmt(frame.elapsed_s, 3)} s"
        )

    def summary_html(self) -> str:
        frame = self._last
        cells: list[tuple[str, str]] = [("run", self.run), ("backend", self.backend)]
        if frame is None:
            cells.append(("status", "no data yet"))
        else:
            total = f" / {frame.total_steps}" if frame.total_steps else ""
            cells += [
                ("status", frame.status),
                ("step", f"{frame.step}{total}"),
                ("loss", _fmt(frame.latest.get("loss"))),
                *_throughput_cells(frame.latest),
                ("step time (s)", _fmt(frame.latest.get("step_time"), 3)),
                ("elapsed (s)", _fmt(frame.elapsed_s, 3)),
            ]
            clip = clip_summary(frame.latest)
            if clip:
                cells.append(("gradient norm", clip))
            if frame.alerts:
                cells.append(("alerts", "; ".join(a.message for a in frame.alerts[-3:])))
        row = "".join(
            f"<th style='text-align:left;padding:0 8px'>{html.escape(k)}</th>" for k, _ in cells
        )
        val = "".join(f"<td style='padding:0 8px'>{html.escape(v)}</td>" for _, v in cells)
        return (
            "<div class='nbmonitor-summary'><b>nbmonitor</b> (static summary of the last update)"
            f"<table><tr>{row}</tr><tr>{val}</tr></table></div>"
        )

    # -- internals ------------------------------------------------------------------------------

    def _widgets(self) -> Iterable[widgets.Widget]:
        yield self._panel
        yield from self._curves.all_widgets()
        yield from self._timeline.widgets()

    def _apply(self, frame: Frame) -> None:
        # GPU figures are created first, so the hold below covers their first data too.
        self._curves.prepare(frame.series, len(frame.devices))
        with ExitStack() as stack:
            for w in self._widgets():
                stack.enter_context(w.hold_sync())
            self._apply_panel(frame)
            self._curves.update(frame.series, frame.latest)
            self._timeline.update(frame.timeline)
        self._last = frame
        self.publishes += 1

    def _apply_panel(self, frame: Frame) -> None:
        latest = frame.latest
        panel = self._panel
        header: dict[str, Any] = {
            "run": frame.run,
            "backend": frame.backend,
            "status": frame.status,
            "step": int(frame.step),
            "total_steps": frame.total_steps,
            "elapsed_s": _num(frame.elapsed_s),
            "eta_s": _num(frame.eta_s),
        }
        for key in _HEADER_KEYS:
            header[key] = _num(latest.get(key))
        header["mfu_note"] = frame.notes.get("mfu")  # why MFU is missing, if it is
        panel.header = header
        panel.system = {key: _num(latest.get(key)) for key in _SYSTEM_KEYS}
        panel.devices = [_json(d) for d in frame.devices]
        panel.alerts = [_alert(a) for a in frame.alerts]
        panel.errors = [str(e) for e in frame.errors]
        if frame.layers is None:
            panel.layers, panel.layers_grid, panel.layers_steps = {}, b"", b""
        else:
            panel.layers, panel.layers_grid, panel.layers_steps = _layers_state(frame.layers)

    def _on_scale(self, key: str, change: Mapping[str, Any]) -> None:
        with self._lock:
            self._curves.set_mode(key, str(change["new"]))

    def _on_reset(self) -> None:
        with self._lock:
            self._curves.reset_zoom()


def _throughput_cells(latest: Mapping[str, float]) -> list[tuple[str, str]]:
    """tokens/s (or samples/s without token ids), and TFLOP/s and MFU once FLOPs are counted."""
    tokens = latest.get("tokens_per_s", math.nan)
    if math.isfinite(tokens):
        cells = [("tokens/s", _fmt(tokens, 3))]
    else:
        cells = [("samples/s", _fmt(latest.get("samples_per_s"), 3))]
    tflops = latest.get("tflops_per_s", math.nan)
    if math.isfinite(tflops):
        mfu = latest.get("mfu_percent", math.nan)
        cells.append(("TFLOP/s", _fmt(tflops, 3)))
        cells.append(("MFU", f"{mfu:.1f}%" if math.isfinite(mfu) else "–"))
    return cells


def _with_status(frame: Frame, status: str) -> Frame:
    from dataclasses import replace

    return replace(frame, status=status)
