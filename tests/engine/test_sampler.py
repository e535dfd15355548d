"""Sources of a tick: error accounting and pacing."""

from __future__ import annotations

import pytest

from nbmonitor._engine.sampler import Stage as Source
from nbmonitor.errors import MAX_FAILURES_IN_A_ROW, ErrorLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def costly(clock: Clock, seconds: float, calls: list[float]):
    def fn() -> None:
        calls.append(clock.now)
        clock.now += seconds

    return fn


def test_paced_source_keeps_to_its_share_of_time():
    clock, calls = Clock(), []
    source = Source(
        "health", costly(clock, 0.002, calls), ErrorLog(), share=0.01, clock=clock, cpu_clock=clock
    )
    source(paced=True)  # took 2 ms: the next paced run is due 0.2 s after this one began
    for _ in range(3):
        clock.now += 0.05
        source(paced=True)
    assert len(calls) == 1
    clock.now = 100.2
    source(paced=True)
    assert len(calls) == 2


def test_unpaced_calls_always_run():
    clock, calls = Clock(), []
    source = Source(
        "view", costly(clock, 0.5, calls), ErrorLog(), share=0.01, clock=clock, cpu_clock=clock
    )
    for _ in range(3):
        source(paced=False)
    assert len(calls) == 3


def test_source_without_share_runs_on_every_tick():
    clock, calls = Clock(), []
    source = Source("sample", costly(clock, 0.5, calls), ErrorLog(), clock=clock, cpu_clock=clock)
    for _ in range(3):
        source(paced=True)
    assert len(calls) == 3


def test_failing_paced_source_is_paced_and_disabled_after_failures_in_a_row():
    clock, errors = Clock(), ErrorLog()

    def fail() -> None:
        clock.now += 0.001
        raise ValueError("broken")

    source = Source("health", fail, errors, share=0.01, clock=clock, cpu_clock=clock)
    source(paced=True)
    source(paced=True)  # too soon after the failed run: not even attempted
    assert errors.counts == {"health": 1}
    for _ in range(MAX_FAILURES_IN_A_ROW):
        clock.now += 1.0
        source(paced=True)
    assert "health" in errors.disabled
    assert errors.counts["health"] == MAX_FAILURES_IN_A_ROW


def test_a_costly_source_is_paused_for_max_gap_at_most():
    clock, calls = Clock(), []
    source = Source(
        "view", costly(clock, 1.0, calls), ErrorLog(), share=0.01, clock=clock, cpu_clock=clock
    )
    source(paced=True)  # 1 s of CPU would mean 100 s at a 1 % share: capped at 5 s
    clock.now += 3.9
    source(paced=True)
    assert len(calls) == 1
    clock.now += 0.2
    source(paced=True)
    assert len(calls) == 2


def test_one_slow_run_among_cheap_ones_does_not_stall_a_paced_source():
    clock, calls = Clock(), []
    cost = [0.001]

    def fn() -> None:
        calls.append(clock.now)
        clock.now += cost[0]

    source = Source("view", fn, ErrorLog(), share=0.01, clock=clock, cpu_clock=clock)
    for _ in range(3):
        source(paced=True)
        clock.now += 0.5
    cost[0] = 2.0  # one slow run (the first frame of a big plot, a garbage collection)
    source(paced=True)
    cost[0] = 0.001
    clock.now += 0.5
    source(paced=True)  # judged by the median cost (1 ms -> 0.1 s), not by the 2 s run
    assert len(calls) == 5


def test_waiting_is_not_cost():
    # Wall time passes (the GIL is busy elsewhere) but the source used no CPU of its own.
    wall, cpu, calls = Clock(), Clock(), []
    source = Source(
        "view", costly(wall, 1.0, calls), ErrorLog(), share=0.01, clock=wall, cpu_clock=cpu
    )
    source(paced=True)
    wall.now += 0.001
    source(paced=True)
    assert len(calls) == 2


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_share_must_be_a_fraction(share):
    with pytest.raises(ValueError, match="share"):
        Source("x", lambda: None, ErrorLog(), share=share)
