"""What the timeline is drawn from: the step-time band, the stacked phases, the gantt, and
the frame that carries them (live and replayed alike)."""

from __future__ import annotations

import collections
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers import mlp

import nbmonitor
from nbmonitor._engine.assemble import spans as spans_module
from nbmonitor._engine.assemble.spans import SpanLog
from nbmonitor._engine.derive.timeline import MIN_WINDOW, phase_stack, step_time_band
from nbmonitor._engine.store import Store
from nbmonitor.records import PHASE_KEYS


def steps_store(n: int, **columns: np.ndarray) -> Store:
    store = Store()
    store.extend_columns({"step": np.arange(1.0, n + 1), **columns})
    return store


def test_step_time_band_is_a_rolling_median_with_its_extremes() -> None:
    times = np.full(200, 0.1)
    times[::10] = 5.0  # one spike in ten steps: it must not move the median
    band = step_time_band(steps_store(200, step_time=times))
    x, median = band["step_time_median"]
    assert np.all(median == 0.1)
    assert band["step_time_max"][1].max() == 5.0 and band["step_time_min"][1].min() == 0.1
    assert len(x) == 200 - MIN_WINDOW + 1 and x[-1] == 200.0
    # A long run is cut to about BAND_POINTS windows.
    long = step_time_band(steps_store(100_000, step_time=np.full(100_000, 0.1)))
    assert len(long["step_time_median"][0]) <= 400
    assert step_time_band(Store()) == {}


def test_phase_stack_bins_are_aligned_means() -> None:
    n = 1000
    data = np.where(np.arange(n) < 500, 0.01, 0.03)
    store = steps_store(n, phase_data_s=data, phase_forward_s=np.full(n, 0.02))
    found = phase_stack(store, points=100)
    assert found is not None
    names, x, seconds = found
    assert names == ("data", "forward")
    assert seconds.shape == (2, 100) and x.shape == (100,) and x[-1] == n
    np.testing.assert_allclose(seconds[0, :50], 0.01)
    np.testing.assert_allclose(seconds[0, 50:], 0.03)
    np.testing.assert_allclose(seconds[1], 0.02)
    assert phase_stack(steps_store(3, loss=np.ones(3))) is None


def test_gantt_lays_phases_back_from_each_steps_end() -> None:
    log = SpanLog()
    rows = []
    for step in range(1, 6):
        row = {"step": float(step), "time": 10.0 * step, "step_time": 1.0}
        row.update(zip(PHASE_KEYS, (0.5, 0.1, 0.2, 0.05, 0.15), strict=True))
        rows.append(row)
    log.add_steps(rows)
    log.add_spans([{"name": "data", "step": 5, "start": 49.0, "dur": 0.5, "depth": 0}])
    bars = log.gantt(steps=2)
    assert {b.step for b in bars} == {4, 5}
    phases = [b for b in bars if b.track == "phases" and b.step == 5]
    assert [b.name for b in phases] == ["optimizer", "other", "backward", "forward", "data"]
    # Step 4 ended at t=40 and step 5 at 50, each 1 s of phases: step 4's data (at 39) is 0.
    by = {(b.step, b.name, b.track): b for b in bars}
    assert by[(4, "data", "phases")].start_s == pytest.approx(0.0)
    assert by[(5, "optimizer", "phases")].start_s == pytest.approx(50.0 - 0.15 - 39.0)
    assert by[(5, "data", "spans")].start_s == pytest.approx(49.0 - 39.0)


def test_the_frame_carries_the_timeline_live_and_replayed(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        for _ in range(20):
            with mon.span("data"):
                x = torch.randn(4, 8)
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        live = mon.frame().timeline
    assert live is not None
    assert live.phases == ("data", "forward", "backward", "other", "optimizer")
    assert live.seconds.shape == (5, len(live.steps))
    names = [(r["kind"], r["name"]) for r in live.summary]
    assert set(names[:5]) == {("phase", n) for n in live.phases}  # phases first
    assert names[5:] == [("span", "data")]
    replayed = nbmonitor.open(mon.run_dir).frame().timeline
    assert replayed is not None
    counts = {(r["kind"], r["name"]): r["count"] for r in replayed.summary}
    assert counts[("span", "data")] == 20 and counts[("phase", "forward")] == 20
    assert {b.track for b in replayed.gantt} == {"phases", "spans"}
    series = nbmonitor.open(mon.run_dir).frame().series
    assert {"step_time_median", "step_time_min", "step_time_max"} <= set(series)


def test_a_tailed_run_feeds_the_timeline_record_by_record() -> None:
    from nbmonitor._engine.run_state import RunState

    state = RunState({}, "tailed")
    steps = [
        {"step": float(s), "time": 10.0 * s, "step_time": 0.5, "phase_data_s": 0.25}
        for s in range(1, 5)
    ]
    spans = [{"name": "eval", "step": 4, "start": 39.0, "dur": 0.2, "depth": 0, "thread": 0}]
    state.add_rows({"steps": steps, "spans": spans})
    timeline = state.frame("running").timeline
    assert timeline is not None
    rows = {(r["kind"], r["name"]): r for r in timeline.summary}
    assert rows[("phase", "data")]["count"] == 4
    assert rows[("phase", "data")]["percent"] == pytest.approx(50.0)
    assert rows[("span", "eval")]["total_s"] == pytest.approx(0.2)
    assert timeline.phases == ("data",)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1023, 1024])
def test_the_summary_median_is_statistics_median_to_the_bit(n):
    rng = np.random.default_rng(n)
    values = collections.deque((rng.lognormal(-5, 3, n) * rng.choice([1, -1], n)).tolist())
    values[0] = 1e308 if n > 1 else values[0]
    assert spans_module._median(values) == statistics.median(values)
    ties = collections.deque([0.1, 0.2] * n)
    assert spans_module._median(ties) == statistics.median(ties)


def test_the_summary_median_window_is_the_last_values_however_they_came() -> None:
    rng = np.random.default_rng(7)
    stats, kept = spans_module._Stats("phase"), collections.deque(maxlen=spans_module.MEDIAN_WINDOW)
    for size in [3, 700, 1, 1, 2000, *([1] * 150), 5, 1024, *([2] * 40)]:
        values = rng.lognormal(-5, 1, size)
        stats.add(values)
        kept.extend(values.tolist())
        assert stats.window().tolist() == list(kept)
        assert len(stats.recent) <= spans_module.MEDIAN_CHUNKS
        assert stats.row("data", 1.0)["median_s"] == statistics.median(kept)
