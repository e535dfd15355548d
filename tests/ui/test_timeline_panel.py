"""The timeline panel and the step-time charts of the dashboard, from hand-made Frames."""

from __future__ import annotations

import numpy as np
from tests.ui.test_dashboard import Sent, make_frame, sent  # noqa: F401  (the fixture)

from nbmonitor._engine.frame import GanttBar, Series, TimelineFrame
from nbmonitor.ui import Dashboard

PHASES = ("data", "forward", "backward", "other", "optimizer")


def timeline(n: int = 50) -> TimelineFrame:
    seconds = np.vstack([np.full(n, v) for v in (0.05, 0.01, 0.02, 0.001, 0.004)])
    gantt = (
        GanttBar("phases", "data", 49, 0.0, 0.05),
        GanttBar("phases", "forward", 49, 0.05, 0.002),
        GanttBar("spans", "load", 49, 0.0, 0.049),
        GanttBar("spans depth 1", "decode", 49, 0.01, 0.02),
    )
    summary = (
        {"name": "data", "kind": "phase", "count": 49, "mean_s": 0.05, "median_s": 0.05,
         "std_s": 0.001, "min_s": 0.04, "max_s": 0.07, "total_s": 2.45, "percent": 58.6},
        {"name": "load", "kind": "span", "count": 49, "mean_s": 0.049, "median_s": 0.049,
         "std_s": 0.0, "min_s": 0.049, "max_s": 0.049, "total_s": 2.4, "percent": float("nan")},
    )  # fmt: skip
    return TimelineFrame(PHASES, np.arange(1.0, n + 1), seconds, gantt, summary)


def test_the_timeline_shows_stacked_phases_a_gantt_and_the_summary(sent: Sent) -> None:  # noqa: F811
    dash = Dashboard("r", "cpu", None)
    dash.publish(make_frame(10))
    panel = dash._timeline
    assert panel.box.layout.display == "none"  # no phases, no spans: hidden
    dash.publish(make_frame(50, timeline=timeline()))
    assert panel.box.layout.display is None
    # Stacked: each phase's line is the sum of it and the phases before it.
    tops = {name: mark.y for name, mark in panel._stack.items()}
    np.testing.assert_allclose(tops["data"], 0.05, rtol=1e-6)
    np.testing.assert_allclose(tops["forward"], 0.06, rtol=1e-6)
    np.testing.assert_allclose(tops["optimizer"], 0.085, rtol=1e-6)
    assert panel._stack["data"].x.dtype == np.float32 and len(panel._stack["data"].x) == 50
    # The gantt: four bars in ms on three tracks, named where wide enough.
    np.testing.assert_allclose(panel._bars.x[0], [0.0, 50.0], rtol=1e-6)
    assert list(panel._bars.y[:, 0]) == [0.0, 0.0, 1.0, 2.0]
    assert list(panel._tracks.text) == ["phases", "spans", "spans depth 1"]
    assert "forward" not in panel._names.text and "data" in panel._names.text
    # The summary table: Oumi's columns, times in ms, NaN as a dash.
    table = panel.table.value
    for column in ("count", "mean", "median", "std", "min", "max", "total", "% of run"):
        assert f"<th>{column}</th>" in table
    assert "data (phase)" in table and "50 ms" in table and "58.6 %" in table and "–" in table
    # The same timeline again sends nothing for the panel.
    sent.clear()
    dash.publish(make_frame(51, timeline=timeline()))
    ids = {mid for mid, _, _ in sent.messages}
    assert not ids & {w.model_id for w in panel.widgets()}


def test_step_time_is_a_median_with_a_band_and_throughput_has_its_own_chart(
    sent: Sent,  # noqa: F811
) -> None:
    x = np.arange(10.0, 60.0)
    series = {
        "step_time_median": Series(x, np.full(50, 0.1)),
        "step_time_min": Series(x, np.full(50, 0.08)),
        "step_time_max": Series(x, np.full(50, 0.5)),
        "samples_per_s": Series(x, np.full(50, 640.0)),
    }
    dash = Dashboard("r", "cpu", None)
    dash.publish(make_frame(60, series=series))
    figures = dash._curves.figures
    band, median = figures["step_time"].lines
    assert band.mark.fill == "between" and band.mark.y.shape == (2, 50)
    np.testing.assert_allclose(band.mark.y[:, 0], [0.08, 0.5], rtol=1e-6)
    np.testing.assert_allclose(median.mark.y, 0.1, rtol=1e-6)
    throughput = figures["throughput"]
    assert [ln.key for ln in throughput.lines] == ["samples_per_s"]
    assert figures["step_time"].figure.title == "Step time (s)"
    shown = {k for k, f in figures.items() if f.figure in dash._curves.grid.children}
    assert {"step_time", "throughput"} <= shown
    assert "tokens" not in shown  # inputs that are not token ids: no tokens/s chart
    series["tokens_per_s"] = Series(x, np.full(50, 8e4))
    dash.publish(make_frame(61, series=series))
    assert dash._curves.figures["tokens"].figure in dash._curves.grid.children
