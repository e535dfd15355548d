"""Where the rules are judged: grid points fixed by the data, so that the same run raises the
same alerts at the same steps however its checks fell (issue #32: the alert's step followed
the machine's speed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.health.synthetic import Run

from nbmonitor.health import Alert, Health, HealthInput
from nbmonitor.health.checker import THINNED
from nbmonitor.health.slices import GRID_SECONDS, GRID_STEPS, LOOKBACK, cuts, grid_end, until


def test_the_step_grid_is_absolute_and_coarser_as_the_run_grows() -> None:
    steps = np.array([1, 15, 16, 17, 1000, 1008, 1023, 1024, 1025, 2049, 70000], dtype=float)
    assert grid_end(steps).tolist() == [16, 16, 16, 32, 1024, 1024, 1024, 1024, 1088, 2176, 73728]
    assert GRID_STEPS == 16


def test_a_check_is_cut_at_grid_points_and_the_newest_steps_wait() -> None:
    steps = np.arange(1.0, 101.0)
    quick = 1000.0 + steps * 0.001  # a fast run: the step grid alone
    got = cuts(steps, quick, 0, None, final=False)
    assert [c.end for c in got] == [16, 32, 48, 64, 80, 96] and all(c.grid for c in got)
    final = cuts(steps, quick, 0, None, final=True)
    assert [(c.end, c.grid) for c in final[-2:]] == [(96, True), (100, False)]
    # From where the last check stopped (row 40, step 41): the same grid points.
    assert [c.end for c in cuts(steps, quick, 40, None, final=False)] == [48, 64, 80, 96]
    # A row that is the grid point itself closes its slice at once.
    assert [c.end for c in cuts(steps[:32], quick[:32], 16, None, final=False)] == [32]
    # A slow run (2 s a step): the time grid cuts every GRID_SECONDS of its recorded time,
    # from its first row (step 1, 1002 s: 1008 s is the first at least 5 s later).
    slow = 1000.0 + steps * 2.0
    ends = [c.end for c in cuts(steps, slow, 0, None, final=False)]
    assert ends[:4] == [4, 7, 10, 13] and GRID_SECONDS == 5.0
    assert [c.end for c in cuts(steps, slow, 7, 1014.0, final=False)][:2] == [10, 13]
    # Logged every 10 steps: the last row before each grid point (10, 30, 40, 60, 80, 90).
    sparse = np.arange(10.0, 101.0, 10.0)
    assert [c.end for c in cuts(sparse, None, 0, None, final=False)] == [1, 3, 4, 6, 8, 9]


def test_a_slice_sees_a_bounded_lookback_and_what_is_true_now_once() -> None:
    run = Run()
    run.add(2000)
    run.system = {"step": np.arange(10.0), "time": np.arange(10.0)}
    inp = run.input(window=2000)
    steps = np.asarray(inp.steps["step"])
    part = until(inp, steps, 1500, 1600, now=False)
    assert part.steps["step"].size == LOOKBACK + 100 and part.step == 1600
    assert part.layer_grad_norms is not None and part.layer_grad_norms.shape[1] == LOOKBACK + 100
    assert part.system is None and part.update_ratios is None
    now = until(inp, steps, 1900, 2000, now=True)
    assert now.system is inp.system and now.step == inp.step


class Faulty(Run):
    """A run with a loss spike, a layer whose gradient explodes and one whose gradient
    vanishes, recorded at ``seconds`` a step."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.add(140)
        self.add(6, loss=30.0)
        self.add(100)
        self.add(4, fc3_weight=80.0)
        self.add(60)
        self.add(150, fc1_weight=1e-9)

    def upto(self, n: int, window: int) -> HealthInput:
        inp = self.input(window=self.step)
        keep = slice(max(0, n - window), n)
        steps = {k: v[keep] for k, v in inp.steps.items()}
        steps["time"] = 1000.0 + steps["step"] * self.seconds
        assert inp.layer_grad_norms is not None and inp.layer_steps is not None
        return dataclasses.replace(
            inp,
            step=n,
            steps=steps,
            layer_steps=inp.layer_steps[keep],
            layer_grad_norms=inp.layer_grad_norms[:, keep],
        )


def said(alerts: list[Alert]) -> list[tuple[str, int, str, tuple[str, ...]]]:
    return [(a.rule, a.step, a.message, a.layers) for a in alerts]


def checked(run: Faulty, every: int, budget_s: float = float("inf")) -> list[Alert]:
    """The run checked every ``every`` steps (each check brings what came since the last
    step judged, as the pipeline does), then once more, final, at its end."""
    health, alerts = Health(), []
    for n in [*range(every, run.step, every), run.step]:
        judged = int(health.judged_step or 0)
        alerts += health.check(run.upto(n, n - judged + 512), final=False, budget_s=budget_s)
    while int(health.judged_step or 0) < run.step:  # a bounded check left some for later
        judged = int(health.judged_step or 0)
        alerts += health.check(run.upto(run.step, run.step - judged + 512), budget_s=budget_s)
    return alerts


@pytest.mark.parametrize("seconds", [0.01, 1.0], ids=["step-grid", "time-grid"])
def test_the_same_run_raises_the_same_alerts_at_the_same_steps_however_it_is_checked(
    seconds: float,
) -> None:
    run = Faulty(seconds)
    reference = said(checked(run, 1))
    rules = {r for r, *_ in reference}
    assert {"loss_spike", "exploding_gradients", "vanishing_gradients"} <= rules, reference
    for every in (3, 16, 37, 128, run.step):
        assert said(checked(run, every)) == reference, every
    # Checks that stop after a slice or two (their CPU budget spent) judge the same.
    assert said(checked(run, 128, budget_s=0.0)) == reference


def test_a_bounded_check_judges_a_slice_more_once_its_budget_is_spent() -> None:
    run = Faulty(0.01)
    health = Health()
    handed: list[int] = []  # the sampler hands the GIL over between two slices
    health.check(run.upto(200, 200), final=False, budget_s=0.0, between=lambda: handed.append(1))
    assert handed == [1]
    # Two slices at least (the first gives the cost of one); the pipeline runs it again next tick.
    assert health.judged_step == 32 and health.behind
    health.check(run.upto(200, 200), final=False)
    assert health.judged_step == 192 and not health.behind  # 193..200 wait for grid point 208
    health.check(run.upto(200, 200), final=True)
    assert health.judged_step == 200 and not health.behind


def test_a_check_far_behind_judges_every_step_at_fewer_points() -> None:
    run = Faulty(0.01)
    passes: list[float] = []
    health = Health()
    inner = health._check

    def counted(inp: HealthInput) -> list[Alert]:
        passes.append(inp.steps["step"][-1])
        return inner(inp)

    health._check = counted  # type: ignore[method-assign]
    # 460 steps, 28 grid points: more than 100 steps behind, it judges them at THINNED points.
    health.check(run.upto(run.step, run.step), final=False, thin_beyond=100)
    assert len(passes) == THINNED and health.judged_step == 448 and not health.behind
    # Every step up to the newest grid point was judged, in wider slices.
    assert passes[-1] == 448
    # Not far behind: the grid as it is.
    passes.clear()
    health.reset()
    health.check(run.upto(run.step, run.step), final=False, thin_beyond=1000)
    assert len(passes) == 28
