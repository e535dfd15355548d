"""The notebook dashboard, driven with hand-made Frames (no engine, no kernel).

What a publish sends is measured where ipywidgets hands it to the comm (``Widget._send``): the
JSON part plus the binary buffers (the curves and the heatmap in the codec), which is what
crosses the wire.
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
from nbmonitor.ui.codec import decode
from nbmonitor.ui.panels.layers import MAX_HEATMAP_CELLS, bound_heatmap


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


def curve(dash: Dashboard, panel: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) of one curve as the widget holds it."""
    state = getattr(dash.widget, f"panel_{panel}")["series"][key]
    return decode(state["x"]), decode(state["y"])


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


def test_the_header_carries_the_cuda_allocator_settings(sent: Sent) -> None:
    dash = Dashboard("test-run", "cuda", 1000)
    dash.publish(make_frame(100, allocator="expandable_segments:True"))
    assert dash.widget.header["allocator"] == "expandable_segments:True"


def test_the_header_carries_the_adapters_verdict(sent: Sent) -> None:
    dash = Dashboard("test-run", "cpu", 1000)
    dash.publish(make_frame(100))
    assert dash.widget.header["adapters"] == ""  # no adapters: no chip
    line = "adapters learning: 4 LoRA matrices, B left zero in 2 of 2 (median norm 0.03)"
    dash.publish(make_frame(101, adapters=line))
    assert dash.widget.header["adapters"] == line


def test_publish_updates_the_header_and_the_panels(sent: Sent) -> None:
    dash = Dashboard("test-run", "cpu", 1000)
    dash.publish(make_frame(100))
    w = dash.widget
    assert w.header["step"] == 100
    assert w.header["loss"] == 0.5
    assert w.header["best_loss"] == 0.25
    assert w.header["status"] == "running"
    assert w.header["allocator"] == ""  # no CUDA allocator on this run
    assert w.system["cpu_percent"] == 37.0
    assert w.panels == ["training", "system", "memory", "layers", "timeline"]
    x, y = curve(dash, "training", "loss")
    assert y.dtype == np.float32 and len(x) == 100
    np.testing.assert_allclose(y[:3], [1.0, 0.5, 1.0 / 3], rtol=1e-6)
    # Only the series the frame has: no empty "Learning rate" without an optimizer.
    assert set(w.panel_training["series"]) == {"loss", "loss_smooth"}
    assert set(w.panel_system["series"]) == {"cpu_percent"}
    # One message for the whole publish, carrying every changed trait at once.
    assert len(sent.messages) == 1
    assert {"header", "system", "panel_training", "panel_system"} <= set(sent.states(w.model_id)[0])

    sent.clear()
    dash.publish(make_frame(101))
    assert w.header["step"] == 101
    assert len(curve(dash, "training", "loss")[0]) == 101


def test_nan_is_sent_as_null(sent: Sent) -> None:
    dash = Dashboard("r", "cpu", None)
    frame = make_frame(10)
    frame.latest["loss"] = float("nan")
    dash.publish(replace(frame, eta_s=float("inf")))
    assert dash.widget.header["loss"] is None
    assert dash.widget.header["eta_s"] is None
    assert sent.nbytes > 0  # json.dumps(allow_nan=False) accepted every message


def test_unchanged_panels_are_not_resent(sent: Sent) -> None:
    dash = Dashboard("r", "cpu", None)
    frame = make_frame(50)
    dash.publish(frame)
    sent.clear()
    dash.publish(frame)
    assert not [k for st in sent.states(dash.widget.model_id) for k in st if "panel" in k]
    assert sent.nbytes < 2_000
    # Training paused, the machine still sampled: only the system panel is sent.
    x = np.arange(51, dtype=np.float64)
    series = dict(frame.series, cpu_percent=Series(x, np.full(51, 40.0)))
    sent.clear()
    dash.publish(replace(frame, series=series))
    keys = {k for st in sent.states(dash.widget.model_id) for k in st}
    assert "panel_system" in keys and "panel_training" not in keys


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
    # 13 curves x (x + y) x <= ~2,002 points x 4 bytes, plus JSON: bounded whatever n is.
    assert sent.nbytes < 230_000, sent.nbytes
    # The spike survives decimation into what the browser receives.
    assert float(curve(dash, "training", "loss")[1].max()) == pytest.approx(50.0)
    buffers = [b for _, _, bufs in sent.messages for b in bufs]
    assert any(np.frombuffer(b, dtype=np.float32).max() == pytest.approx(50.0) for b in buffers)


def test_close_shows_closed_and_ignores_later_publishes(sent: Sent) -> None:
    dash = Dashboard("r", "cpu", 1000)
    dash.publish(make_frame(10))
    dash.close(make_frame(20))  # status "running" in the frame: close marks it closed
    assert dash.closed
    assert dash.widget.header["status"] == "closed"
    assert dash.widget.header["step"] == 20
    sent.clear()
    dash.publish(make_frame(30))
    dash.close(make_frame(40))
    assert dash.widget.header["step"] == 20
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
    # The static fallback draws the main curves (nbviewer and GitHub show no widget).
    assert "<svg" in html and "loss: " in html


def test_the_dashboard_is_one_anywidget_with_the_built_front_end() -> None:
    dash = Dashboard("r", "cpu", None)
    w = dash.widget
    assert type(w).__name__ == "DashboardWidget"
    assert {f"panel_{n}" for n in ("training", "system", "layers", "timeline", "ranks")} <= set(
        w.keys
    )
    # The ESM is the built bundle (uPlot inside), not the "not built" fallback, and nothing in
    # it is fetched at run time.
    esm = str(w._esm)
    assert "not built" not in esm and len(esm) > 20_000
    assert "https://" not in esm and "http://" not in esm
    assert "export{" in esm.replace(" ", "") or "export default" in esm


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
    assert dash.widget.devices[0]["name"] == "H100"
    assert dash.widget.devices[0]["temperature_c"] is None
    assert dash.widget.system["energy_per_step_j"] == 6.0
    np.testing.assert_allclose(curve(dash, "system", "gpu0_mem_used_bytes")[1], 50.0)  # % of total
    assert dash.widget.panel_system["notes"]["devices"] == [0, 1]
    assert "gpu1_util_percent" in dash.widget.panel_system["series"]


def test_alerts_and_errors_reach_the_panel() -> None:
    dash = Dashboard("r", "cpu", None)
    alert = Alert("vanishing", "warning", "Gradients vanish", 12, 1.0, ("fc1", "fc2"))
    dash.publish(make_frame(20, alerts=(alert,), errors=("sampler: boom",)))
    assert dash.widget.alerts == [
        {
            "rule": "vanishing",
            "severity": "warning",
            "message": "Gradients vanish",
            "step": 12,
            "layers": ["fc1", "fc2"],
            "cause": "",
            "evidence": {},
            "place": "",
            "fix": "",
            "explains": [],
        }
    ]
    assert dash.widget.errors == ["sampler: boom"]
    assert "Gradients vanish" in dash.summary_html()


def test_the_alert_strip_carries_what_an_opened_alert_shows() -> None:
    # The frame's alert with its cause, evidence (NaN as null: JSON has none), place, fix and
    # the symptoms it took in: what the strip shows when the alert is opened (js/src/widget.js).
    dash = Dashboard("r", "cpu", None)
    alert = Alert(
        "zero_grad_missing", "warning", "m", 120, 1.0,
        cause="optimizer.zero_grad() is never called",
        evidence={"grad_norm": np.array([0.4, 40.0]), "loss": float("nan"), "steps": (1, 120)},
        place="param group 0", fix="call it once per step",
        explains=(("exploding_gradients", 40),),
    )  # fmt: skip
    dash.publish(make_frame(20, alerts=(alert,)))
    [sent_alert] = dash.widget.alerts
    assert sent_alert["cause"] == "optimizer.zero_grad() is never called"
    assert sent_alert["evidence"] == {"grad_norm": [0.4, 40.0], "loss": None, "steps": [1, 120]}
    assert (sent_alert["place"], sent_alert["fix"]) == ("param group 0", "call it once per step")
    assert sent_alert["explains"] == [["exploding_gradients", 40]]
    assert json.loads(json.dumps(sent_alert, allow_nan=False)) == sent_alert


def test_layers_panel_data_is_sent_binary(sent: Sent) -> None:
    dash = Dashboard("r", "cpu", None)
    dash.publish(make_frame(10))
    assert dash.widget.panel_layers == {}
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
    meta = dash.widget.panel_layers
    assert meta["names"] == ["fc1.weight", "fc2.weight"]
    assert meta["grid"]["shape"] == [2, 3] and meta["grid"]["dtype"] == "float32"
    assert meta["table"][0]["shape"] == [4, 8]
    assert meta["table"][0]["update_ratio"] is None
    assert meta["table"][1]["flags"] == ["exploding"]
    np.testing.assert_allclose(decode(meta["grid"]), grid, rtol=1e-6)
    np.testing.assert_array_equal(decode(meta["steps"]), [1.0, 2.0, 3.0])
    # The grid travels as a binary buffer, not as JSON numbers.
    (_, msg, buffers) = next(m for m in sent.messages if m[0] == dash.widget.model_id)
    assert ["panel_layers", "grid", "view"] in msg["buffer_paths"]
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


def test_marimo_is_shown_the_anywidget_itself() -> None:
    dash = Dashboard("r", "cpu", None)
    assert dash._display_() is dash.widget
