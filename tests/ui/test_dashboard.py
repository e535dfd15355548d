"""The notebook dashboard, driven with hand-made Frames (no engine, no kernel).

What a publish sends is measured where ipywidgets hands it to the comm (``Widget._send``): the
JSON part plus the binary buffers (bqplot arrays, the heatmap), which is what crosses the wire.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import ipywidgets
import numpy as np
import pytest

from nbmonitor._engine.frame import Alert, Frame, LayerFrame, Series
from nbmonitor._engine.store import Store
from nbmonitor.ui import Dashboard, in_notebook
from nbmonitor.ui.dashboard import MAX_HEATMAP_CELLS, bound_heatmap


@dataclass
class Sent:
    """Messages the widgets handed to their comms."""

    messages: list[tuple[str, dict[str, Any], list[Any]]] = field(default_factory=list)

    def clear(self) -> None:
        self.messages.clear()

    @property
    def nbytes(self) -> int:
        total = 0
        for _, msg, buffers in self.messages:
            # allow_nan=False: a NaN would make jupyter_client warn and rewrite the message.
            total += len(json.dumps(msg, allow_nan=False))
            total += sum(memoryview(b).nbytes for b in buffers)
        return total

    def states(self, model_id: str) -> list[dict[str, Any]]:
        return [m["state"] for mid, m, _ in self.messages if mid == model_id]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sent]:
    record = Sent()

    def _send(self: ipywidgets.Widget, msg: dict[str, Any], buffers: Any = None) -> None:
        if self.comm is not None:  # None while a widget is still being constructed
            record.messages.append((self.comm.comm_id, msg, list(buffers or [])))

    monkeypatch.setattr(ipywidgets.Widget, "_send", _send)
    yield record


def make_frame(
    step: int = 100,
    *,
    series: dict[str, Series] | None = None,
    status: str = "running",
    **kwargs: Any,
) -> Frame:
    latest = {
        "loss": 0.5,
        "best_loss": 0.25,
        "samples_per_s": 1234.5,
        "step_time": 0.02,
        "cpu_percent": 37.0,
        "process_cpu_percent": 99.0,
        "ram_used_bytes": 8e9,
        "ram_total_bytes": 16e9,
        "process_rss_bytes": 1e9,
        "lr": float("nan"),
    }
    if series is None:
        x = np.arange(step, dtype=np.float64)
        series = {
            "loss": Series(x, 1.0 / (1.0 + x)),
            "loss_smooth": Series(x, 1.0 / (1.0 + x)),
            "cpu_percent": Series(x, np.full(step, 37.0)),
        }
    return Frame(
        run="test-run",
        backend="cpu",
        status=status,
        step=step,
        total_steps=1000,
        elapsed_s=10.0,
        eta_s=90.0,
        latest=latest,
        series=series,
        **kwargs,
    )


def test_publish_updates_panel_and_marks(sent: Sent) -> None:
    dash = Dashboard("test-run", "cpu", 1000)
    dash.publish(make_frame(100))
    panel = dash._panel
    assert panel.header["step"] == 100
    assert panel.header["loss"] == 0.5
    assert panel.header["best_loss"] == 0.25
    assert panel.header["status"] == "running"
    assert panel.system["cpu_percent"] == 37.0
    loss = dash._curves.figures["loss"].lines[0].mark
    assert loss.x.dtype == np.float32 and len(loss.x) == 100
    np.testing.assert_allclose(loss.y[:3], [1.0, 0.5, 1.0 / 3], rtol=1e-6)
    # Figures appear once they have data: loss and CPU, not learning rate (no lr series).
    shown = {k for k, f in dash._curves.figures.items() if f.figure in dash._curves.grid.children}
    assert shown == {"loss", "cpu"}
    # One message per changed widget, the panel's carrying every changed trait at once.
    ids = [mid for mid, _, _ in sent.messages]
    assert len(ids) == len(set(ids))
    assert {"header", "system"} <= set(sent.states(panel.model_id)[0])

    sent.clear()
    dash.publish(make_frame(101))
    assert panel.header["step"] == 101
    assert len(dash._curves.figures["loss"].lines[0].mark.x) == 101


def test_nan_is_sent_as_null(sent: Sent) -> None:
    dash = Dashboard("r", "cpu", None)
    frame = make_frame(10)
    frame.latest["loss"] = float("nan")
    dash.publish(replace(frame, eta_s=float("inf")))
    assert dash._panel.header["loss"] is None
    assert dash._panel.header["eta_s"] is None
    assert sent.nbytes > 0  # json.dumps(allow_nan=False) accepted every message


def test_unchanged_series_are_not_resent(sent: Sent) -> None:
    dash = Dashboard("r", "cpu", None)
    frame = make_frame(50)
    dash.publish(frame)
    sent.clear()
    dash.publish(frame)
    marks = {ln.mark.model_id for f in dash._curves.figures.values() for ln in f.lines}
    assert not [m for m in sent.messages if m[0] in marks]
    assert sent.nbytes < 2_000


def _store_frame(n: int, spike_at: int) -> Frame:
    """A Frame built the way the engine builds it: a Store of n steps, decimated series."""
    store = Store()
    steps = np.arange(n, dtype=np.float64)
    rng = np.random.default_rng(0)
    loss = 2.0 * np.exp(-steps / max(n / 5, 1)) + 0.05 * rng.random(n)
    loss[spike_at] = 50.0
    cols = {
        "step": steps,
        "loss": loss,
        "loss_smooth": loss,
        "lr": np.full(n, 1e-3),
        "grad_norm": 1 + rng.random(n),
        "step_time": 0.01 + 0.001 * rng.random(n),
        "samples_per_s": 6400 + rng.random(n),
        "cpu_percent": 50 + rng.random(n),
        "process_cpu_percent": 90 + rng.random(n),
        "ram_used_bytes": 8e9 + rng.random(n),
        "process_rss_bytes": 1e9 + rng.random(n),
        "ram_total_bytes": np.full(n, 16e9),
    }
    chunk = 100_000
    names = list(cols)
    for start in range(0, n, chunk):
        block = np.column_stack([cols[k][start : start + chunk] for k in names])
        store.extend([dict(zip(names, row, strict=True)) for row in block.tolist()])
    series = {k: Series(*store.series(k, max_points=2000)) for k in names if k != "step"}
    return make_frame(n, series=series)


@pytest.mark.parametrize("n", [1_000, 10_000, 100_000, 1_000_000])
def test_publish_payload_is_bounded(sent: Sent, n: int) -> None:
    if n == 1_000_000:
        pytest.importorskip("tsdownsample")
    frame = _store_frame(n, spike_at=n // 3)
    dash = Dashboard("r", "cpu", None)
    dash.publish(frame)
    # 11 lines x (x + y) x <= ~2,002 points x 4 bytes, plus JSON: bounded whatever n is.
    assert sent.nbytes < 200_000, sent.nbytes
    # The spike survives decimation into what the browser receives.
    loss_mark = dash._curves.figures["loss"].lines[0].mark
    assert float(loss_mark.y.max()) == pytest.approx(50.0)
    loss_id = loss_mark.model_id
    buffers = [b for mid, _, bufs in sent.messages if mid == loss_id for b in bufs]
    assert any(np.frombuffer(b, dtype=np.float32).max() == pytest.approx(50.0) for b in buffers)


def test_close_shows_closed_and_ignores_later_publishes(sent: Sent) -> None:
    dash = Dashboard("r", "cpu", 1000)
    dash.publish(make_frame(10))
    dash.close(make_frame(20))  # status "running" in the frame: close marks it closed
    assert dash.closed
    assert dash._panel.header["status"] == "closed"
    assert dash._panel.header["step"] == 20
    sent.clear()
    dash.publish(make_frame(30))
    dash.close(make_frame(40))
    assert dash._panel.header["step"] == 20
    assert sent.messages == []
    assert "closed" in dash.summary_text()


def test_repr_mimebundle_has_static_summary() -> None:
    dash = Dashboard("my-run", "cpu", 1000)
    before = dash._repr_mimebundle_()
    assert "no data yet" in before["text/plain"]
    dash.publish(make_frame(123))
    bundle = dash._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == dash.widget.model_id
    assert "step 123/1000" in bundle["text/plain"]
    html = bundle["text/html"]
    assert "123 / 1000" in html and "0.5" in html and "running" in html
    assert "<script" not in html


def test_dashboard_widget_composes_panel_controls_and_curves() -> None:
    dash = Dashboard("r", "cpu", None)
    box = dash.widget
    assert isinstance(box, ipywidgets.VBox)
    assert box.children[0] is dash._panel
    assert box.children[2] is dash._curves.grid
    # The panel's ESM is the built bundle, not the "not built" fallback.
    assert "not built" not in dash._panel._esm
    assert len(dash._panel._esm) > 1_000


def test_scale_toggle_switches_log_and_linear() -> None:
    dash = Dashboard("r", "cpu", None)
    curves = dash._curves
    assert curves.mode("loss") == "linear" and curves.mode("grad_norm") == "log"
    dash._scale_toggles["loss"].value = "log"
    assert curves.mode("loss") == "log"
    fig = curves.figures["loss"]
    assert all(type(ln.mark.scales["y"]).__name__ == "LogScale" for ln in fig.lines)
    assert fig.panzoom.scales["y"][0] is fig.y_axis.scale
    dash._scale_toggles["grad_norm"].value = "linear"
    assert curves.mode("grad_norm") == "linear"
    # PanZoom is the figures' interaction (drag to pan, wheel to zoom), and reset clears it.
    assert type(fig.figure.interaction).__name__ == "PanZoom"
    curves.x_scale.min, curves.x_scale.max = 10.0, 20.0
    curves.reset_zoom()
    assert curves.x_scale.min is None and curves.x_scale.max is None


def test_gpu_gauges_and_figures(sent: Sent) -> None:
    dash = Dashboard("r", "cuda", None)
    x = np.arange(20, dtype=np.float64)
    series = {
        "loss": Series(x, x),
        "gpu0_util_percent": Series(x, np.full(20, 80.0)),
        "gpu0_mem_used_bytes": Series(x, np.full(20, 40e9)),
        "gpu1_util_percent": Series(x, np.full(20, 10.0)),
    }
    device = {
        "name": "H100",
        "util_percent": 80.0,
        "mem_used_bytes": 40e9,
        "mem_total_bytes": 80e9,
        "temperature_c": float("nan"),
        "power_w": 300.0,
        "power_limit_w": 700.0,
        "throttle": "",
    }
    frame = make_frame(20, series=series, devices=(device, device))
    frame.latest.update({"gpu0_mem_total_bytes": 80e9, "energy_per_step_j": 6.0})
    dash.publish(frame)
    assert dash._panel.devices[0]["name"] == "H100"
    assert dash._panel.devices[0]["temperature_c"] is None
    assert dash._panel.system["energy_per_step_j"] == 6.0
    gpu0 = dash._curves.figures["gpu0"]
    np.testing.assert_allclose(gpu0.lines[1].mark.y, 50.0)  # memory as % of total
    assert "gpu1" in dash._curves.figures
    assert gpu0.figure in dash._curves.grid.children


def test_alerts_and_errors_reach_the_panel() -> None:
    dash = Dashboard("r", "cpu", None)
    alert = Alert("vanishing", "warning", "Gradients vanish", 12, 1.0, ("fc1", "fc2"))
    dash.publish(make_frame(20, alerts=(alert,), errors=("sampler: boom",)))
    assert dash._panel.alerts == [
        {
            "rule": "vanishing",
            "severity": "warning",
            "message": "Gradients vanish",
            "step": 12,
            "layers": ["fc1", "fc2"],
        }
    ]
    assert dash._panel.errors == ["sampler: boom"]
    assert "Gradients vanish" in dash.summary_html()


def test_layers_panel_data_is_sent_binary(sent: Sent) -> None:
    dash = Dashboard("r", "cpu", None)
    dash.publish(make_frame(10))
    assert dash._panel.layers == {} and dash._panel.layers_grid == b""
    grid = np.log10(np.array([[1.0, 2.0, np.nan], [10.0, 20.0, 30.0]]))
    layers = LayerFrame(
        names=("fc1.weight", "fc2.weight"),
        steps=np.array([1.0, 2.0, 3.0]),
        log10_grad_norm=grid,
        table=(
            {"name": "fc1.weight", "shape": (4, 8), "numel": 32, "dtype": "float32",
             "grad_norm": 2.0, "param_norm": np.float32(1.5), "update_ratio": float("nan"),
             "flags": ()},
            {"name": "fc2.weight", "shape": (8,), "numel": 8, "dtype": "float32",
             "grad_norm": 30.0, "param_norm": 1.0, "update_ratio": 1e-3,
             "flags": ("exploding",)},
        ),
    )  # fmt: skip
    sent.clear()
    dash.publish(make_frame(11, layers=layers))
    meta = dash._panel.layers
    assert meta["names"] == ["fc1.weight", "fc2.weight"]
    assert (meta["n_layers"], meta["n_steps"]) == (2, 3)
    assert meta["table"][0]["shape"] == [4, 8]
    assert meta["table"][0]["update_ratio"] is None
    assert meta["table"][1]["flags"] == ["exploding"]
    decoded = np.frombuffer(dash._panel.layers_grid, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(decoded, grid, rtol=1e-6)
    np.testing.assert_array_equal(np.frombuffer(dash._panel.layers_steps), [1.0, 2.0, 3.0])
    # The grid travels as a binary buffer, not as JSON numbers.
    (_, msg, buffers) = next(m for m in sent.messages if m[0] == dash._panel.model_id)
    assert "layers_grid" in msg["buffer_paths"][0] or ["layers_grid"] in msg["buffer_paths"]
    assert any(memoryview(b).nbytes == 2 * 3 * 4 for b in buffers)


def test_heatmap_is_bounded_and_keeps_spikes() -> None:
    rows, cols = 600, 5_000
    grid = np.zeros((rows, cols))
    grid[7, 4321] = 9.0
    grid[8, :] = np.nan
    steps = np.arange(cols, dtype=np.float64)
    small, xs = bound_heatmap(grid, steps)
    assert small.size <= MAX_HEATMAP_CELLS and small.shape[0] == rows
    assert small.shape[1] == xs.shape[0]
    assert small[7].max() == 9.0
    assert np.isnan(small[8]).all()
    assert xs[-1] == cols - 1


def test_publish_from_threads_is_safe(sent: Sent) -> None:
    dash = Dashboard("r", "cpu", None)

    def worker(offset: int) -> None:
        for i in range(20):
            dash.publish(make_frame(10 + offset + i))

    threads = [threading.Thread(target=worker, args=(k * 100,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert dash.publishes == 80


def test_in_notebook_is_false_outside_a_kernel() -> None:
    assert in_notebook() is False


def test_in_notebook_detects_a_kernel_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.core.getipython as getipython

    class ZMQInteractiveShell:  # the name is what counts: no kernel needed
        config: ClassVar[dict[str, Any]] = {}

    class TerminalInteractiveShell:
        config: ClassVar[dict[str, Any]] = {}

    class KernelAppShell:
        config: ClassVar[dict[str, Any]] = {"IPKernelApp": {}}

    for shell, expected in (
        (ZMQInteractiveShell(), True),
        (TerminalInteractiveShell(), False),
        (KernelAppShell(), True),
        (None, False),
    ):
        monkeypatch.setattr(getipython, "get_ipython", lambda shell=shell: shell)
        assert in_notebook() is expected, shell


def test_show_displays_and_close_refreshes_the_static_summary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import IPython.display

    from nbmonitor.ui import show

    updates: list[dict[str, Any]] = []

    class Handle:
        def update(self, obj: Any) -> None:
            updates.append(obj._repr_mimebundle_())

    shown: list[Any] = []

    def fake_display(obj: Any, display_id: bool = False) -> Handle:
        assert display_id is True
        shown.append(obj)
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    dash = Dashboard("r", "cpu", 50)
    show(dash)
    assert shown == [dash]
    dash.publish(make_frame(10))
    assert updates == []  # publishes never touch the display (sampler thread rule)

    # close() from another thread (the sampler's) does not refresh either...
    worker = threading.Thread(target=dash.close, args=(make_frame(50),))
    worker.start()
    worker.join()
    assert dash.closed and updates == []
    # ...but from the main thread (mon.close() in a cell) it re-sends the final summary.
    dash2 = Dashboard("r2", "cpu", 50)
    show(dash2)
    dash2.close(make_frame(50))
    assert len(updates) == 1
    assert "closed" in updates[0]["text/html"] and "50 / 1000" in updates[0]["text/html"]
