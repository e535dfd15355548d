"""The timeline panel and the step-time charts of the dashboard, from hand-made Frames."""

from __future__ import annotations

import json

import numpy as np
from tests.ui.test_dashboard import Sent, make_frame, sent  # noqa: F401  (the fixture)

from nbmonitor._engine.frame import GanttBar, Series, TimelineFrame
from nbmonitor.ui import Dashboard
from nbmonitor.ui.codec import decode
from nbmonitor.ui.panels.timeline import MAX_BARS

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


def test_the_timeline_sends_phases_a_gantt_and_the_summary(sent: Sent) -> None:  # noqa: F811
    dash = Dashboard("r", "cpu", None)
    dash.publish(make_frame(10))
    assert dash.widget.panel_timeline == {}  # no phases, no spans: nothing to show
    dash.publish(make_frame(50, timeline=timeline()))
    state = dash.widget.panel_timeline
    assert state["phases"] == list(PHASES)
    seconds = decode(state["seconds"])
    assert seconds.shape == (5, 50) and seconds.dtype == np.float32
    np.testing.assert_allclose(seconds[:, 0], [0.05, 0.01, 0.02, 0.001, 0.004], rtol=1e-6)
    np.testing.assert_array_equal(decode(state["steps"]), np.arange(1.0, 51))
    # The gantt: [track, name, step, start s, duration s], in order.
    assert state["gantt"][0] == ["phases", "data", 49, 0.0, 0.05]
    assert [b[0] for b in state["gantt"]] == ["phases", "phases", "spans", "spans depth 1"]
    # The summary rows, NaN as null.
    assert state["summary"][0]["name"] == "data" and state["summary"][0]["percent"] == 58.6
    assert state["summary"][1]["percent"] is None
    json.dumps(state["summary"], allow_nan=False)
    # The same timeline again sends nothing for the panel.
    sent.clear()
    dash.publish(make_frame(51, timeline=timeline()))
    assert not [k for st in sent.states(dash.widget.model_id) for k in st if k == "panel_timeline"]


def test_the_gantt_is_bounded() -> None:
    bars = tuple(GanttBar("phases", "data", i, i * 0.1, 0.05) for i in range(1_000))
    dash = Dashboard("r", "cpu", None)
    timeline = TimelineFrame(PHASES, np.zeros(0), np.zeros((5, 0)), bars)
    dash.publish(make_frame(50, timeline=timeline))
    gantt = dash.widget.panel_timeline["gantt"]
    assert len(gantt) == MAX_BARS and gantt[-1][2] == 999  # the newest bars


def test_step_time_is_a_median_with_its_band_and_throughput_is_sent(
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
    sent_series = dash.widget.panel_training["series"]
    assert set(sent_series) == set(series)
    np.testing.assert_allclose(decode(sent_series["step_time_min"]["y"]), 0.08, rtol=1e-6)
    np.testing.assert_allclose(decode(sent_series["step_time_max"]["y"]), 0.5, rtol=1e-6)
    np.testing.assert_allclose(decode(sent_series["step_time_median"]["y"]), 0.1, rtol=1e-6)
    series["tokens_per_s"] = Series(x, np.full(50, 8e4))
    dash.publish(make_frame(61, series=series))
    assert "tokens_per_s" in dash.widget.panel_training["series"]
