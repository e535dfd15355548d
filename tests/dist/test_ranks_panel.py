"""The ranks panel and the job's console view, fed with a job written to disk (no torch): the
heatmap is the ranks panel's (rows are ranks), the tables carry the cross-rank view,
and what is synced stays JSON-safe and bounded."""

from __future__ import annotations

import json
import logging
import pathlib

import numpy as np
import pytest
from tests.dist.dist_helpers import JOB_STEPS, write_job

import nbmonitor
from nbmonitor._engine.derive.ranks import RankState
from nbmonitor._engine.derive.ranks_frame import ranks_frame
from nbmonitor.replay.job import Job
from nbmonitor.ui.codec import decode
from nbmonitor.ui.panels.layers import MAX_HEATMAP_COLUMNS
from nbmonitor.ui.console import LINE_WIDTH, PREFIX
from nbmonitor.ui.ranks import RanksConsoleView, RanksDashboard, status_line


def open_job(tmp_path: pathlib.Path, steps: int = JOB_STEPS) -> Job:
    job = nbmonitor.open(write_job(tmp_path / "runs", slow=1, steps=steps))
    assert isinstance(job, Job)
    return job


def test_the_panel_shows_ranks_by_steps_and_the_tables(tmp_path: pathlib.Path) -> None:
    job = open_job(tmp_path)
    panel = job.dashboard()
    assert isinstance(panel, RanksDashboard) and panel.closed
    state = panel.widget
    assert state.panels == ["ranks"]
    layers = state.panel_ranks["heat"]
    assert layers["names"] == ["rank0 (node0)", "rank1 (node1)"]
    assert layers["title"].startswith("step_time per rank") and layers["label"] == "step_time"
    grid = decode(layers["grid"])
    assert grid.shape == (2, JOB_STEPS) and np.allclose(grid, 0.05)
    assert state.header["status"] == "closed" and state.header["step"] == JOB_STEPS
    # The median of the ranks' last losses (1/n and 1/n + 0.01: dist_helpers.write_job).
    assert state.header["loss"] == pytest.approx(1 / JOB_STEPS + 0.005)
    assert [a["message"][:26] for a in state.alerts] == ["Rank 1 on node1 is a strag"]
    assert state.system["process_rss_bytes"] == 1e9  # rank 0's host
    assert state.devices == []  # CPU ranks: no GPU cards
    tables = {t["field"]: t for t in state.panel_ranks["tables"]}
    assert set(tables) == {"ranks", "per_step", "summary"}
    assert len(tables["ranks"]["rows"]) == 2
    json.dumps([state.header, state.alerts, state.system, tables], allow_nan=False)
    html = panel._repr_mimebundle_()["text/html"]
    for field in ("ranks", "per_step", "summary"):
        assert f"data-field='{field}'" in html
    assert "phase_data_s" in html and "straggler" in html  # the summary, the rank's flags
    bundle = panel._repr_mimebundle_()
    assert "cross-rank summary" in bundle["text/plain"] and "<table" in bundle["text/html"]


def test_a_long_job_is_bounded(tmp_path: pathlib.Path) -> None:
    panel = open_job(tmp_path, steps=1000).dashboard()
    layers = panel.widget.panel_ranks["heat"]
    assert layers["grid"]["shape"][1] <= MAX_HEATMAP_COLUMNS
    assert layers["label"] == "step_time"  # equal step times: nothing to cap
    tables = {t["field"]: t for t in panel.widget.panel_ranks["tables"]}
    assert len(tables["per_step"]["rows"]) < 40  # the newest steps only


def test_the_console_view_of_a_job(tmp_path: pathlib.Path) -> None:
    frame = open_job(tmp_path).frame()
    line = status_line(frame)
    wide = status_line(frame, width=400)
    assert "2/2 ranks" in wide and f"step {JOB_STEPS}" in wide and "slowest rank" in wide
    # The straggler's alert, cut to fit a 100-column terminal (the summary has it whole).
    assert len(PREFIX + line) <= LINE_WIDTH, line
    assert "1 alert(s); latest: Rank 1 on node1 is a" in line and line.endswith("…"), line
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("test-ranks-console")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    view = RanksConsoleView(logger, every=60.0)
    view.publish(frame)
    view.publish(frame)  # rate-limited
    view.close(frame)
    view.close(frame)
    assert len(records) == 2 and "cross-rank summary" in records[1]
    assert "Rank 1 on node1 is a straggler" in records[1]


def test_a_slow_first_step_does_not_darken_the_heatmap() -> None:
    state = RankState()
    for rank in (0, 1):
        times = np.full(200, 0.05 + 0.01 * rank)
        times[0] = 5.0  # warm-up
        state.add_columns(rank, "steps", {"step": np.arange(1.0, 201), "step_time": times})
    panel = RanksDashboard("job")
    panel.close(ranks_frame(state, "job", "closed", 2))
    layers = panel.widget.panel_ranks["heat"]
    assert "capped at the 99th percentile" in layers["label"]
    grid = decode(layers["grid"])
    assert grid.max() < 1.0  # the warm-up step no longer sets the scale


def test_each_ranks_gpu_is_a_gauge_card() -> None:
    state = RankState()
    for rank in (0, 1):
        state.set_meta(rank, {"hostname": "gpu-node", "device_index": rank})
        state.add_columns(rank, "steps", {"step": np.arange(1.0, 4), "step_time": np.ones(3)})
        util = np.array([10.0, 20.0, 90.0 + rank])
        state.add_columns(rank, "system", {"step": np.arange(3.0), f"gpu{rank}_util_percent": util})
    panel = RanksDashboard("job")
    panel.close(ranks_frame(state, "job", "closed", 2))
    devices = panel.widget.devices
    assert [d["name"] for d in devices] == ["rank0 (gpu-node)", "rank1 (gpu-node)"]
    assert [d["util_percent"] for d in devices] == [90.0, 91.0]
    assert devices[0]["temperature_c"] is None  # not measured: null, never NaN
    json.dumps(devices, allow_nan=False)
