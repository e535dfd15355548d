"""The notebook dashboard: one anywidget (header, gauges, alerts, then a tab per panel).

``Dashboard`` is a View: the sampler thread calls ``publish`` (at most a few times a second) and
``close`` once. Each publish holds the widget's sync while it assigns, so a publish sends at most
one message, carrying only the traits that changed: the header scalars, and the state of each
panel (``nbmonitor.ui.panels``) whose data moved, its curves ~2,000-point float32 arrays in the
binary codec and its heatmap bounded. The charts are drawn by our own front end (uPlot in a
canvas, ``js/src/``), so the dashboard renders wherever anywidget does.
"""

from __future__ import annotations

import contextlib
import html
import math
import threading
from collections.abc import Mapping
from typing import Any

from nbmonitor._engine.frame import Alert, Frame
from nbmonitor.ui.console import clip_summary
from nbmonitor.ui.delivery import MainThreadRoute, Route, choose_route
from nbmonitor.ui.panels import PANELS
from nbmonitor.ui.panels.layers import jsonable
from nbmonitor.ui.static import charts_svg
from nbmonitor.ui.steer_controls import SteerHooks, SteerState, bar_state, read_request
from nbmonitor.ui.widget import DashboardWidget, set_panel

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
    "batch_fits_more",
)
# A header figure -> the chart line whose newest point it shows.
_CHARTED = {
    "step_time": "step_time_median",
    "samples_per_s": "samples_per_s_smooth",
    "tokens_per_s": "tokens_per_s_smooth",
}
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
    """A JSON-safe number: NaN/inf become None (JSON has no NaN)."""
    out = jsonable(value)
    return out if isinstance(out, int | float) else None


def _alert(alert: Alert) -> dict[str, Any]:
    """An alert as the strip reads it: its line, and what it shows when opened (the cause,
    the evidence, the place, the fix and the symptoms it took in)."""
    return {
        "rule": alert.rule,
        "severity": alert.severity,
        "message": alert.message,
        "step": int(alert.step),
        "layers": list(alert.layers),
        "cause": alert.cause,
        "evidence": jsonable(alert.evidence),
        "place": alert.place,
        "fix": alert.fix,
        "explains": [[rule, int(step)] for rule, step in alert.explains],
    }


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}g}"


class Dashboard:
    """Live notebook view of one run. Build it, display it, then feed it Frames."""

    wants_detail = True  # curves and the per-layer panel

    def __init__(
        self,
        run: str,
        backend: str,
        total_steps: int | None,
        route: Route | None = None,
        steer: SteerHooks | None = None,
    ) -> None:
        self.run = run
        self.backend = backend
        self.total_steps = total_steps
        self._lock = threading.Lock()
        self._closed = False
        self._last: Frame | None = None
        self.publishes = 0  # accepted publishes, for tests and the benchmark
        self._handles: list[Any] = []  # IPython DisplayHandles of show(), refreshed by close()

        # On Colab the widget is sent updates from the main thread only (delivery.py).
        self.route = route or choose_route()
        self._main = MainThreadRoute() if self.route == "main" else None
        self._panels = [panel() for panel in PANELS]
        self._widget = DashboardWidget(
            header={
                "run": run,
                "backend": backend,
                "status": "running",
                "step": 0,
                "total_steps": total_steps,
            },
            panels=[p.name for p in self._panels],
            steer=bar_state(None, "running"),
        )
        # A live run's dashboard steers it: the buttons' messages go to ``steer.request``.
        self._steer = steer
        self.steer_requests = 0  # requests handed on, for tests
        if steer is not None:
            self._widget.steer = bar_state(_steer_state(steer), "running")
            self._widget.on_msg(self._on_message)

    # -- View -----------------------------------------------------------------------------------

    @property
    def widget(self) -> Any:
        """The dashboard's widget (display it, or put it in your own layout)."""
        return self._widget

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_frame(self) -> Frame | None:
        return self._last

    def publish(self, frame: Frame) -> None:
        """Show ``frame``. Safe from any thread; ignored once the dashboard is closed."""
        if self._main is not None:
            self._main.offer(lambda: self._publish_now(frame))
        else:
            self._publish_now(frame)

    def close(self, frame: Frame) -> None:
        """Show the final frame as "closed" and stop accepting publishes. Idempotent."""
        if self._main is not None:
            self._main.offer(lambda: self._close_now(frame), final=True)
        else:
            self._close_now(frame)

    def pump(self, *_: object) -> None:
        """Send the update waiting for the main thread (the ``main`` route); called at step
        boundaries by the training loop and on the kernel's event loop. Cheap when none waits."""
        if self._main is not None:
            self._main.pump()

    @property
    def sent_on_main(self) -> int:
        """Updates the main thread sent on the ``main`` route (0 on the ``thread`` route)."""
        return self._main.sent_on_main if self._main is not None else 0

    def _publish_now(self, frame: Frame) -> None:
        with self._lock:
            if self._closed:
                return
            self._apply(frame)

    def _close_now(self, frame: Frame) -> None:
        with self._lock:
            if self._closed:
                return
            # A run a stop ended says so ("stopped", as its folder does), else "closed".
            state = _steer_state(self._steer) if self._steer is not None else None
            final = "stopped" if state is not None and state.stopping else "closed"
            if frame.status != final:
                frame = _with_status(frame, final)
            self._apply(frame)
            self._closed = True
        self._refresh_displays()

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """A custom message from the front end (a steering button). Runs on whichever thread
        the kernel hands the comm message to; never raises (the kernel would only log it)."""
        steer = self._steer
        request = read_request(content)
        if steer is None or request is None:
            return
        try:
            steer.request(*request)
            self.steer_requests += 1
        except Exception:  # the run's side never breaks the kernel's comm handling
            return
        with self._lock:
            if not self._closed:
                status = self._last.status if self._last is not None else "running"
                self._widget.steer = bar_state(_steer_state(steer), status)

    def _display_(self) -> Any:
        """marimo shows what this returns: the anywidget itself (marimo renders anywidgets, not
        the ipywidgets view bundle of ``_repr_mimebundle_``)."""
        return self._widget

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
        bundle = self._widget._repr_mimebundle_(**kwargs)
        data: dict[str, Any] = dict((bundle[0] if isinstance(bundle, tuple) else bundle) or {})
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
                ("step time (s)", _fmt(_charted(frame.latest, "step_time"), 3)),
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
        charts = charts_svg(frame.series) if frame is not None else ""
        return (
            "<div class='nbmonitor-summary'><b>nbmonitor</b> (static summary of the last update)"
            f"<table><tr>{row}</tr><tr>{val}</tr></table>{charts}</div>"
        )

    # -- internals ------------------------------------------------------------------------------

    def _apply(self, frame: Frame) -> None:
        with self._widget.hold_sync():
            self._apply_header(frame)
            for panel in self._panels:
                state = panel.state(frame)
                if state is not None:  # unchanged: nothing sent
                    set_panel(self._widget, panel.name, state)
        self._last = frame
        self.publishes += 1

    def _apply_header(self, frame: Frame) -> None:
        latest = frame.latest
        w = self._widget
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
        # The step time and the rate as the charts draw them (their smoothed lines' newest
        # points), not one step's, which scatters with the machine's noise.
        for key, shown in _CHARTED.items():
            if math.isfinite(latest.get(shown, math.nan)):
                header[key] = _num(latest[shown])
        header["mfu_note"] = frame.notes.get("mfu")  # why MFU is missing, if it is
        header["allocator"] = frame.allocator  # the CUDA allocator's settings, "" elsewhere
        header["adapters"] = frame.adapters  # is the fine-tune training, "" without adapters
        # A trait set to an equal value sends nothing.
        w.header = header
        if self._steer is not None:
            w.steer = bar_state(_steer_state(self._steer), frame.status)
        w.system = {key: _num(latest.get(key)) for key in _SYSTEM_KEYS}
        w.devices = [jsonable(d) for d in frame.devices]
        w.alerts = [_alert(a) for a in frame.alerts]
        w.errors = [str(e) for e in frame.errors]


def _steer_state(steer: SteerHooks) -> SteerState | None:
    """The run's steering state, or None where reading it failed (no bar then)."""
    try:
        return steer.state()
    except Exception:
        return None


def _charted(latest: Mapping[str, float], key: str) -> float:
    """``key`` as its chart draws it (``_CHARTED``), else its newest value (NaN if none)."""
    shown = latest.get(_CHARTED.get(key, key), math.nan)
    return shown if math.isfinite(shown) else latest.get(key, math.nan)


def _throughput_cells(latest: Mapping[str, float]) -> list[tuple[str, str]]:
    """tokens/s (or samples/s without token ids), and TFLOP/s and MFU once FLOPs are counted."""
    tokens = _charted(latest, "tokens_per_s")
    if math.isfinite(tokens):
        cells = [("tokens/s", _fmt(tokens, 3))]
    else:
        cells = [("samples/s", _fmt(_charted(latest, "samples_per_s"), 3))]
    tflops = latest.get("tflops_per_s", math.nan)
    if math.isfinite(tflops):
        mfu = latest.get("mfu_percent", math.nan)
        cells.append(("TFLOP/s", _fmt(tflops, 3)))
        cells.append(("MFU", f"{mfu:.1f}%" if math.isfinite(mfu) else "–"))
    return cells


def _with_status(frame: Frame, status: str) -> Frame:
    from dataclasses import replace

    return replace(frame, status=status)
