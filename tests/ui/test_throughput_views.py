"""Throughput in the views: the header's tokens/s (or samples/s), TFLOP/s and MFU, the
console line, the CPU wording, and the profile table widget."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
from tests.helpers import mlp

import nbmonitor
from nbmonitor._engine.frame import Frame
from nbmonitor.ui import Dashboard
from nbmonitor.ui.console import LINE_WIDTH, PREFIX, status_line, summary_text
from nbmonitor.ui.panels.profile import ProfileView

NOTE = "MFU is not shown: nbmonitor has no peak FLOP/s for CPU (TFLOP/s is still measured)."


def frame(notes: dict[str, str] | None = None, **latest: float) -> Frame:
    values = {"loss": 0.5, "samples_per_s": 128.0, "step_time": 0.25, "process_cpu_percent": 150.0}
    values.update(latest)
    return Frame(
        run="r",
        backend="cpu",
        status="running",
        step=10,
        total_steps=None,
        elapsed_s=3.0,
        eta_s=math.nan,
        latest=values,
        notes=notes or {},
    )


def test_console_shows_samples_per_s_without_token_ids() -> None:
    line = status_line(frame())
    assert "128 samples/s" in line and "tokens/s" not in line and "TFLOP/s" not in line
    assert "CPU 150% of a core" in line


def test_the_console_line_fits_100_columns_keeping_what_matters_most() -> None:
    busy = Frame(
        run="r",
        backend="cuda",
        status="running",
        step=123_456,
        total_steps=1_000_000,
        elapsed_s=3.0,
        eta_s=7200.0,
        latest={
            "loss": 0.123456, "lr": 3e-4, "grad_norm": 1.2345, "grad_clipped_fraction": 0.63,
            "grad_clip_coef": 0.13, "step_time": 0.2345, "tokens_per_s": 123_456.0,
            "tflops_per_s": 312.5, "mfu_percent": 31.6, "process_cpu_percent": 180.0,
            "process_rss_bytes": 5.5 * 2**30, "memory_peak_bytes": 61 * 2**30,
            "memory_limit_bytes": 79 * 2**30, "batch_fits": 96.0, "batch_size": 64.0,
        },
        devices=({"util_percent": 97.0}, {"util_percent": 95.0}),
    )  # fmt: skip
    line = status_line(busy)
    assert len(PREFIX + line) <= LINE_WIDTH, line
    for kept in ("step 123456/1000000", "loss 0.1235", "234.5 ms/step", "123,456 tokens/s"):
        assert kept in line, line
    assert "ETA 2:00:00" in line and "CPU" not in line and "RSS" not in line
    # Everything shows when it fits; nothing is cut mid-part.
    plain = status_line(frame())
    assert (
        plain
        == "step 10 | loss 0.5 | 250.0 ms/step | 128 samples/s | CPU 150% of a core | RSS n/a GiB"
    )
    assert status_line(busy, width=200).count(" | ") > line.count(" | ")


def test_console_shows_tokens_tflops_and_mfu() -> None:
    line = status_line(frame(tokens_per_s=51200.0, tflops_per_s=312.5, mfu_percent=31.58))
    assert "51,200 tokens/s | 312 TFLOP/s | MFU 31.6%" in line
    assert "samples/s" not in line
    line = status_line(frame(tflops_per_s=0.004, mfu_percent=math.nan))
    assert "0.004 TFLOP/s | MFU n/a" in line
    assert "51,200 tokens/s, 312 TFLOP/s, MFU 31.6%" in summary_text(
        frame(tokens_per_s=51200.0, tflops_per_s=312.5, mfu_percent=31.58)
    )
    closing = summary_text(frame({"mfu": NOTE}, tflops_per_s=0.004, mfu_percent=math.nan))
    assert NOTE in closing.splitlines()[2]


def test_dashboard_header_carries_throughput_and_the_mfu_note() -> None:
    dash = Dashboard("r", "cpu", None)
    dash.publish(frame({"mfu": NOTE}, tokens_per_s=512.0, tflops_per_s=0.002, mfu_percent=math.nan))
    header: dict[str, Any] = dash.widget.header
    assert header["tokens_per_s"] == 512.0
    assert header["tflops_per_s"] == 0.002
    assert header["mfu_percent"] is None  # NaN travels as null
    assert header["mfu_note"] == NOTE
    assert "512 tokens/s · 0.002 TFLOP/s · – MFU" in dash.summary_text()
    html = dash.summary_html()
    assert "tokens/s" in html and "TFLOP/s" in html and "samples/s" not in html


def test_profile_view_shows_status_then_rows_with_a_static_fallback() -> None:
    columns = [{"key": "name", "label": "operator", "kind": "text"},
               {"key": "self_cpu_ms", "label": "self CPU (ms)", "kind": "num"}]  # fmt: skip
    view = ProfileView(columns)
    view.show_status("waiting")
    assert view.widget.status == "waiting"
    assert "waiting" in view.summary_text()
    view.show_rows("steps 3-5", [{"name": "aten::mm", "self_cpu_ms": 1.5, "x": math.nan}], "t.json")
    w = view.widget
    assert w.status == "" and w.title == "steps 3-5" and w.trace_path == "t.json"
    assert w.rows == [{"name": "aten::mm", "self_cpu_ms": 1.5, "x": None}]
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "<td>aten::mm</td><td>1.5</td>" in bundle["text/html"]
    view.show_error("broke")
    assert "broke" in view.summary_text()


def test_the_header_shows_the_step_time_and_rate_the_charts_draw(tmp_path: Path) -> None:
    # A real loop whose steps alternate between fast and slow: one step's time (the newest)
    # is not what the step-time chart draws; the header shows the chart's newest point, and
    # samples/s gets its smoothed line.
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for i in range(41):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.03 if i % 4 == 3 else 0.001)  # the last step is a fast one
    built = mon.frame()
    median = built.series["step_time_median"].y[-1]
    assert built.latest["step_time_median"] == median
    assert built.latest["step_time"] != median  # one step's, not the chart's
    rate = built.series["samples_per_s_smooth"]
    assert rate.y.size and built.latest["samples_per_s_smooth"] == rate.y[-1]
    dash = Dashboard("r", "cpu", None)
    dash.publish(built)
    header: dict[str, Any] = dash.widget.header
    assert header["step_time"] == median and header["samples_per_s"] == rate.y[-1]
    assert {"samples_per_s", "samples_per_s_smooth"} <= set(dash.widget.panel_training["series"])
    assert f"{median:.3g}" in dash.summary_html()
    dash.close(built)
