"""What a pass of the rules costs, counted rather than timed (issue 39): the numpy calls a rule
makes on a quiet slice, the primitives the rules share (made once a check), and the verdicts
skipped where a rule cannot hold (``Outcome.judged`` worked out only when asked)."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest
from benchmarks.numpy_calls import NumpyCalls, count_numpy
from numpy.lib.stride_tricks import sliding_window_view
from tests.health.synthetic import Run

from nbmonitor.health import Health, HealthInput, slices
from nbmonitor.health import rule as rule_module
from nbmonitor.health.rules import loss as loss_rules
from nbmonitor.health.rules import time as time_rules
from nbmonitor.health.rules.gradients import ExplodingGradients, GradientSpike, _trailing_minima
from nbmonitor.health.rules.loss import LossSpike
from nbmonitor.health.rules.lr import LrScheduleTooFast
from nbmonitor.health.rules.updates import UpdateRatioHigh, UpdateRatioLow
from nbmonitor.health.structure import Observation, Structure, StructureLog
from nbmonitor.health.view import HealthView
from nbmonitor.records import OptimizerRecord

T = TypeVar("T")

PHASES = ("data", "forward", "backward", "optimizer")


def timed(inp: HealthInput, spells: int = 0) -> HealthInput:
    """``inp`` with step times and phases (the data phase a third of the step: input-bound),
    and ``spells`` busy spells of the monitor's sampler, each over one step in ten."""
    n = inp.steps["step"].size
    rng = np.random.default_rng(1)
    step_time = 0.01 * rng.lognormal(0, 0.1, n)
    columns = dict(inp.steps, step_time=step_time)
    for i, phase in enumerate(PHASES):
        columns[f"phase_{phase}_s"] = step_time * (0.4 if i == 0 else 0.2)
    # A fast loop: 10 ms a step, so that a slice is the step grid's 16 steps.
    ends = 1000.0 + 0.01 * inp.steps["step"]
    columns["time"] = ends
    busy = tuple((float(ends[-2 * k - 1]) - 0.005, float(ends[-2 * k - 1])) for k in range(spells))
    return dataclasses.replace(inp, steps=columns, time=float(ends[-1]), monitor_busy=busy[::-1])


def quiet_run(steps: int = 192) -> Run:
    run = Run()
    run.add(steps)
    return run


def calls_per_rule(health: Health, inp: HealthInput) -> dict[str, int]:
    counter = NumpyCalls()
    count_numpy(health, counter)
    health.check(inp)
    return counter.counts


def test_a_quiet_pass_makes_few_numpy_calls() -> None:
    """On a quiet slice (nothing near holding) the window rules make a bounded number of
    numpy calls: exploding_gradients took about 100 before its verdict was skipped where no
    window rises above the run's maximum."""
    health, run = Health(), quiet_run()
    health.check(timed(run.input()))
    run.add(16)
    counts = calls_per_rule(health, timed(run.input()))
    assert 0 < counts["exploding_gradients"] <= 32, counts
    # No optimizer record: the optimizer rule has nothing to suggest and measures nothing.
    assert "optimizer_share" not in counts, counts


def lines_in(module: str, run: Callable[..., T], *args: Any) -> tuple[int, T]:
    """How many lines of ``module``'s code ``run(*args)`` runs (a count, not a time), and what
    it returned."""
    lines = 0

    def trace(frame: Any, event: str, _: Any) -> Any:
        nonlocal lines
        if frame.f_code.co_filename.endswith(module):
            lines += event == "line"
            return trace
        return None

    sys.settrace(trace)
    try:
        got = run(*args)
    finally:
        sys.settrace(None)
    return lines, got


def lines_run(health: Health, inp: HealthInput, module: str) -> int:
    """How many lines of ``module``'s code one check runs."""
    return lines_in(module, health.check, inp)[0]


def test_the_time_rules_do_not_loop_over_the_monitors_busy_spells() -> None:
    """The steps apart from the sampler's busy spells (up to BUSY_KEPT of them) are found in a
    few calls for them all, not a few a spell: a check runs as many lines of the time rules
    with 64 spells as with one."""
    ran = []
    for spells in (1, 64):
        health, run = Health(), quiet_run()
        health.check(timed(run.input(), spells))
        run.add(16)
        ran.append(lines_run(health, timed(run.input(), spells), "health/rules/time.py"))
    assert ran[0] == ran[1], ran


def test_apart_from_monitor_is_the_spell_by_spell_answer() -> None:
    rng = np.random.default_rng(7)
    for trial in range(40):
        run = quiet_run(int(rng.integers(60, 300)))
        inp = timed(run.input())
        ends = inp.steps["time"]
        if trial % 2:  # overlapping spells, in no order of their ends
            starts = rng.uniform(ends[0], ends[-1], int(rng.integers(1, 64)))
            spells = tuple((float(a), float(a + rng.uniform(0, 0.5))) for a in np.sort(starts))
        else:  # the sampler's: one after another
            edges = np.sort(rng.uniform(ends[0], ends[-1], 2 * int(rng.integers(1, 64))))
            spells = tuple(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))
        # The tick running now.
        spells += ((max(float(ends[-3]), spells[-1][1]), float("inf")),)
        inp = dataclasses.replace(inp, monitor_busy=spells)
        view = HealthView(inp, None, None, 100)
        total = inp.steps["step_time"][-int(rng.integers(10, 200)) :]
        end = inp.steps["time"][-total.size :]
        expected = np.ones(total.size, dtype=bool)
        for lo, hi in spells:
            expected &= ~((end - total < hi) & (end > lo))
        assert np.array_equal(time_rules._apart_from_monitor(view, total), expected)


def test_the_share_rules_read_the_recent_steps_once_a_check() -> None:
    """input_bound and optimizer_share read the same recent step times and the same steps
    apart from the monitor: made once for the two of them (``HealthView.shared``)."""
    made: list[int] = []
    original = time_rules._recent

    def recent(view: HealthView) -> Any:
        made.append(1)
        return original(view)

    run = quiet_run()
    optimizer = OptimizerRecord(0, "AdamW", "cpu", "for-loop", can_fuse=True, can_foreach=True)
    inp = dataclasses.replace(timed(run.input(), spells=3), optimizer=optimizer)
    view = HealthView(inp, 150.0, 150.0, 100)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time_rules, "_recent", recent)
        rules = (time_rules.InputBound, time_rules.OptimizerShare)
        outcomes = [rule(Health().thresholds).check(view) for rule in rules]
    assert [o.rule for o in outcomes] == ["input_bound", "optimizer_share"]
    assert made == [1]


class Counted(ExplodingGradients):
    """exploding_gradients that counts its verdicts (``_explodes``)."""

    verdicts = 0

    def _explodes(self, *args: Any) -> Any:
        Counted.verdicts += 1
        return super()._explodes(*args)


def test_exploding_skips_its_verdict_where_nothing_can_hold() -> None:
    """Where no window rises above the run's maximum no layer (nor the total) can hold: the
    verdict is not worked out, and what was judged is asked only while an episode is open."""
    Counted.verdicts = 0
    health, run = Health(rules=(Counted,)), quiet_run(120)
    health.check(run.input())
    run.add(16)
    assert health.check(run.input()) == []
    assert Counted.verdicts == 0  # quiet, no episode open: no verdict at all
    run.add(3, fc3_weight=50.0, fc3_bias=60.0)
    assert [a.rule for a in health.check(run.input())] == ["exploding_gradients"]
    Counted.verdicts = 0
    run.add(16)  # quiet again, the episode open: whether fc3 was judged clear is asked
    assert health.check(run.input()) == []
    assert Counted.verdicts >= 1


class Holds:
    """A rule that holds for ``n`` layers at its first check and then has nothing new to
    judge (``nothing``): an episode stays open over many subjects."""

    name = "holds"

    def __init__(self, thresholds: Any, n: int = 1) -> None:
        self.n = n
        self.checked = 0

    def check(self, view: HealthView) -> Any:
        self.checked += 1
        if self.checked == 1:
            names = [f"layer{i}" for i in range(self.n)]
            return rule_module.Outcome(self.name, names, rule_module.always, lambda _new: [])
        return rule_module.nothing(self.name)

    def reset(self) -> None:
        self.checked = 0


def test_a_pass_with_nothing_judged_does_not_visit_the_open_episodes() -> None:
    """A rule with nothing new to judge returns the one ``nothing`` outcome of its name, and
    settling it does not walk the subjects of its open episode: a check runs as many lines of
    the checker with 1,000 subjects open as with one."""
    assert rule_module.nothing("holds") is rule_module.nothing("holds")
    assert rule_module.clear("holds") is rule_module.clear("holds")
    ran = []
    for n in (1, 1000):
        health = Health(rules=(lambda t, n=n: Holds(t, n),))
        run = quiet_run()
        health.check(timed(run.input()))
        run.add(16)
        ran.append(lines_run(health, timed(run.input()), "health/checker.py"))
    assert ran[0] == ran[1], ran


class CountedSpike(GradientSpike):
    tails = 0

    def _tail_bar(self) -> float:
        CountedSpike.tails += 1
        return super()._tail_bar()


def test_the_spike_rules_skip_what_only_a_spike_needs() -> None:
    """On quiet steps gradient_spike does not read the run's tail of rises (a partition of
    1,024 values) and loss_spike takes one median (not the noise band's second) and no
    windows' minima."""
    CountedSpike.tails = 0
    medians: list[int] = []
    minima: list[int] = []
    original_medians, original_sustained = loss_rules.row_medians, loss_rules.sustained
    health, run = Health(rules=(CountedSpike, LossSpike)), quiet_run()
    health.check(timed(run.input()))
    run.add(16)  # one slice: the grid point at step 208
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loss_rules, "row_medians", lambda a: medians.append(1) or original_medians(a))
        patch.setattr(
            loss_rules, "sustained", lambda *a, **k: minima.append(1) or original_sustained(*a, **k)
        )
        assert health.check(timed(run.input())) == []
    assert CountedSpike.tails == 0
    assert len(medians) == 1 and minima == []


def test_the_schedule_rule_does_not_loop_over_the_new_rows() -> None:
    """lr_schedule_too_fast brings its peak up to date for all the new rows at once while no
    lr falls near zero (a slice of a fast loop holds thousands of rows): it runs as many lines
    for 2,000 new rows as for 50, and keeps the same peak as the row-by-row loop."""
    ran, peaks = [], []
    for n in (50, 2000):
        steps = np.arange(1.0, n + 1)
        lr = 1e-3 * np.cos(steps / (4 * n))  # a slow decay, nowhere near zero
        inp = HealthInput(step=n, time=0.0, steps={"step": steps, "lr": lr})
        rule = LrScheduleTooFast(Health().thresholds)
        view = HealthView(inp, None, None, 100)
        lines, outcome = lines_in("health/rules/lr.py", rule.check, view)
        assert outcome.held == () and outcome.judged("")
        ran.append(lines)
        peaks.append((rule._peak, rule._peak_step))
    assert ran[0] == ran[1], ran
    assert peaks == [(1e-3 * math.cos(1 / 200), 1.0), (1e-3 * math.cos(1 / 8000), 1.0)]


def test_the_spikes_trailing_minima_are_the_windows_minima() -> None:
    """gradient_spike's least norm before each new step, in a few calls however many windows
    (fewer than a window is long, or a wide slice's thousands): each window's minimum."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        window, k = int(rng.integers(1, 40)), int(rng.integers(1, 200))
        seg = rng.lognormal(0, 1, window + k - 1)
        seg[rng.random(seg.size) < 0.1] = np.inf  # a gap reads as no value
        expected = sliding_window_view(seg, window).min(axis=1)
        assert np.array_equal(_trailing_minima(seg, window), expected)


def test_a_checks_cuts_do_not_read_every_new_row() -> None:
    """``cuts`` finds the step grid's slices by one search a slice, not the grid point of each
    of a check's thousands of new rows (``grid_end``: ten array operations over them, and a
    new array each): two numpy calls and one a slice, and the same slices as the row-by-row
    reading."""
    counted = []
    for n in (300, 7700):
        steps = np.arange(40_001.0, 40_001.0 + n)
        counter = NumpyCalls()
        counter.rule = "cuts"
        sys.setprofile(counter)
        try:
            got = slices.cuts(steps, None, 0, None, final=False)
        finally:
            sys.setprofile(None)
        counted.append(counter.counts.get("cuts", 0) - len(got))
        ends = slices.grid_end(steps)
        closes = np.flatnonzero(np.append(ends[1:] != ends[:-1], steps[-1] == ends[-1])) + 1
        assert [c.end for c in got] == closes.tolist()
    assert counted == [2, 2], counted


def test_grid_point_is_grid_end() -> None:
    rng = np.random.default_rng(5)
    steps = np.concatenate(
        (
            np.arange(0.0, 70_000.0),
            [2.0**k + d for k in range(1, 50) for d in (-1.0, 0.0, 1.0)],
            rng.integers(1, 2**45, 20_000).astype(float),
        )
    )
    assert [slices.grid_point(s) for s in steps.tolist()] == slices.grid_end(steps).tolist()


def test_quiet_measured_steps_skip_the_update_rules_verdicts() -> None:
    """A slice that brings many measured steps with no update ratio near either limit judges
    none of them one by one (``_judged``: the lr, the loss, the biases, a step at a time); an
    episode open asks the last step's verdict, which is what the loop over the steps gives."""
    run = Run()
    run.add(400)
    inp = run.input(window=400)
    names = inp.layer_names
    update_steps = np.arange(10.0, 401.0, 10.0)
    series = np.full((len(names), update_steps.size), 1e-3)
    inp = dataclasses.replace(
        inp, update_steps=update_steps, update_series=series, update_ratios=series[:, -1]
    )
    for cls in (UpdateRatioHigh, UpdateRatioLow):
        rule = cls(Health().thresholds)
        calls = 0
        inner = rule._judged

        def judged(*args: Any, inner: Any = inner) -> Any:
            nonlocal calls
            calls += 1
            return inner(*args)

        rule._judged = judged  # type: ignore[method-assign]
        view = HealthView(inp, None, None, 512)
        outcome = rule.check(view)
        assert outcome.held == () and calls == 0
        # The loop over every measured step (what a ratio near a limit takes) says the same.
        slow = cls(Health().thresholds)
        slow._possible = lambda _view, r: np.ones(r.shape, dtype=bool)  # type: ignore[method-assign]
        expected = slow.check(HealthView(inp, None, None, 512))
        assert [outcome.judged(n) for n in names] == [expected.judged(n) for n in names]
        assert any(outcome.judged(n) for n in names) and calls == 1
        assert np.array_equal(rule._streak, slow._streak)
        assert getattr(rule, "_lr_max", None) == getattr(slow, "_lr_max", None)
        # A ratio beyond the limit on one step: every step judged, as before.
        beyond = series.copy()
        beyond[0, -5] = 1.0 if cls is UpdateRatioHigh else 1e-9
        rule = cls(Health().thresholds)
        rule._judged = judged  # type: ignore[method-assign]
        calls = 0
        rule.check(HealthView(dataclasses.replace(inp, update_series=beyond), None, None, 512))
        assert calls == sum(1 for s in update_steps if s >= Health().thresholds.min_history)


def test_the_structure_is_read_by_kind_not_scanned_by_each_rule() -> None:
    """A dozen structural rules each ask a pass's snapshot for one kind of observation, and
    each slice cuts the snapshot at its step: once the snapshot is indexed (one pass over
    it), neither runs more lines for 1,000 observations of other kinds than for 10."""
    ran = []
    for others in (10, 1000):
        observations = [Observation(s, "forward", {}) for s in range(others)]
        observations += [Observation(others + s, "optimizer", {"lr": 0.1}) for s in range(5)]
        snapshot = Structure(tuple(observations))
        snapshot.until(-1)  # the index and the steps, made once a snapshot
        recent, got = lines_in("health/structure.py", snapshot.recent, "optimizer", 3, "lr")
        until, cut = lines_in("health/structure.py", snapshot.until, others + 2)
        assert [o.step for o in got] == [others + 2, others + 3, others + 4]
        assert len(cut.observations) == others + 3
        assert [o.step for o in cut.recent("optimizer", 5)] == [others, others + 1, others + 2]
        ran.append(recent + until)
    assert ran[0] == ran[1], ran


def test_a_snapshot_is_made_again_only_after_an_observation() -> None:
    """A check takes the structure's snapshot every tick; it changes on sampled steps only,
    so the same snapshot (and the index its rules read) serves until one is added."""
    log = StructureLog()
    assert log.snapshot() is None
    log.add(1, "forward", {"a": 1})
    first = log.snapshot()
    assert first is not None and log.snapshot() is first
    log.add(2, "backward", {})
    second = log.snapshot()
    assert second is not first and second is not None
    assert [(o.step, o.kind) for o in second.observations] == [(1, "forward"), (2, "backward")]
    log.clear()
    assert log.snapshot() is None


def test_the_time_grid_searched_is_the_time_grid_read_row_by_row() -> None:
    """With the rows' times in order, ``cuts`` finds the time grid's next point by one search
    a slice instead of comparing every row of the slice: the same slices as the row-by-row
    reading, on runs slow and fast, with steps missing and times repeated."""
    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(2, 2000))
        steps = np.cumsum(rng.integers(1, 4, n)).astype(float)
        times = 1000.0 + np.cumsum(rng.exponential(float(rng.choice([0.01, 0.7, 3.0])), n))
        times[rng.random(n) < 0.1] = times[0]  # repeated times: in order, not ascending
        times = np.maximum.accumulate(times)
        got = [c.end for c in slices.cuts(steps, times, 0, None, final=False)]
        ends, anchor, row = [], times[0], 0
        while row < n:
            late = np.flatnonzero(times[row:] >= anchor + slices.GRID_SECONDS)
            step = slices.grid_end(steps[row:])
            closes = np.flatnonzero(np.append(step[1:] != step[:-1], steps[-1] == step[-1]))
            end = min(
                row + int(late[0]) + 1 if late.size else n + 1,
                row + int(closes[0]) + 1 if closes.size else n + 1,
            )
            if end > n:
                break
            ends.append(end)
            anchor, row = times[end - 1], end
        assert got == ends
