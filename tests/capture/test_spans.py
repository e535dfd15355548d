"""User spans (``mon.span``) with a fake host clock: names, nesting, steps, durations, the
spans stream on disk, the telemetry summary, and what happens around them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.capture.test_phases import FakeClock

import nbmonitor
from nbmonitor.live.monitor import Monitor


def monitor(tmp_path: Path, clock: FakeClock, **kw: Any) -> tuple[Monitor, Any, Any]:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor(
        model, opt, run_dir=tmp_path, display=False, interval=60, timer=clock, clock=lambda: 1e9
    )
    mon.start()
    return mon, model, opt


def step(model: Any, opt: Any, clock: FakeClock, dt: float = 0.0) -> None:
    clock.advance(dt)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_spans_nest_and_carry_their_step(tmp_path: Path) -> None:
    clock = FakeClock()
    mon, model, opt = monitor(tmp_path, clock)
    try:

        @mon.span("eval")
        def evaluate(x: int) -> int:
            clock.advance(0.5)
            return x + 1

        for _ in range(2):
            with mon.span("data"):
                clock.advance(0.01)
                with mon.span("decode"):
                    clock.advance(0.004)
            step(model, opt, clock)
        assert evaluate(1) == 2  # the decorator returns what the function returns
        mon.flush()
        spans = nbmonitor.open(mon.run_dir).records("spans")
    finally:
        mon.close()
    got = [(s["name"], s["step"], s["depth"], round(s["dur"], 9)) for s in spans]
    assert got == [
        ("decode", 1, 1, 0.004),
        ("data", 1, 0, 0.014),
        ("decode", 2, 1, 0.004),
        ("data", 2, 0, 0.014),
        ("eval", 3, 0, 0.5),  # after step 2 ended: part of step 3's time
    ]
    # Start times are wall-clock seconds: the fake wall clock (1e9) plus the host clock's travel.
    first_data = spans[1]
    assert first_data["start"] == pytest.approx(1e9)
    assert spans[0]["start"] == pytest.approx(1e9 + 0.01)
    assert all(s["thread"] == 0 for s in spans)


def test_summary_has_oumis_columns(tmp_path: Path) -> None:
    clock = FakeClock()
    mon, model, opt = monitor(tmp_path, clock)
    try:
        step(model, opt, clock)
        for dt in (0.01, 0.02, 0.03, 0.06):
            with mon.span("data"):
                clock.advance(dt)
            step(model, opt, clock)
        mon.flush()
        timeline = mon.frame().timeline
    finally:
        mon.close()
    assert timeline is not None
    rows = {(r["kind"], r["name"]): r for r in timeline.summary}
    data = rows[("span", "data")]
    assert data["count"] == 4
    assert data["mean_s"] == pytest.approx(0.03)
    assert data["median_s"] == pytest.approx(0.025)
    assert data["std_s"] == pytest.approx(0.0216024689, rel=1e-6)  # sample std
    assert (data["min_s"], data["max_s"]) == pytest.approx((0.01, 0.06))
    assert data["total_s"] == pytest.approx(0.12)
    # % of the time the steps took (the last step's row still open): the spans were all of it.
    assert data["percent"] == pytest.approx(100.0)
    assert ("phase", "data") in rows and ("phase", "optimizer") in rows
    tracks = {bar.track for bar in timeline.gantt}
    assert tracks == {"phases", "spans"}


def test_a_span_lets_the_callers_exception_through_and_still_records(tmp_path: Path) -> None:
    clock = FakeClock()
    mon, _model, _opt = monitor(tmp_path, clock)  # the model kept: a dropped one closes its run
    try:
        with pytest.raises(KeyError), mon.span("lookup"):
            clock.advance(0.1)
            raise KeyError("x")
        mon.flush()
        spans = nbmonitor.open(mon.run_dir).records("spans")
    finally:
        mon.close()
    assert [(s["name"], s["dur"]) for s in spans] == [("lookup", pytest.approx(0.1))]


def test_spans_from_another_thread_nest_on_their_own(tmp_path: Path) -> None:
    clock = FakeClock()
    mon, _model, _opt = monitor(tmp_path, clock)  # the model kept: a dropped one closes its run
    try:
        with mon.span("main"):
            worker = threading.Thread(target=lambda: mon.span("worker").__enter__().__exit__(
                None, None, None))  # fmt: skip
            worker.start()
            worker.join()
        mon.flush()
        spans = nbmonitor.open(mon.run_dir).records("spans")
    finally:
        mon.close()
    by_name = {s["name"]: s for s in spans}
    assert by_name["worker"]["depth"] == 0 and by_name["worker"]["thread"] != 0
    assert by_name["main"]["depth"] == 0 and by_name["main"]["thread"] == 0


def test_spans_after_close_record_nothing(tmp_path: Path) -> None:
    clock = FakeClock()
    mon, _model, _opt = monitor(tmp_path, clock)  # the model kept: a dropped one closes its run
    span = mon.span("late")
    mon.close()
    recorder = mon.internals.recorder
    before = len(recorder)
    with span, mon.span("later"):
        pass
    assert len(recorder) == before


@pytest.mark.parametrize("bad", ["", None, 3])
def test_a_span_needs_a_name(tmp_path: Path, bad: Any) -> None:
    model = torch.nn.Linear(4, 1)
    with (
        nbmonitor.attach(model, None, run_dir=tmp_path, display=False) as mon,
        pytest.raises(TypeError, match="span\\(name\\) needs a non-empty str"),
    ):
        mon.span(bad)
