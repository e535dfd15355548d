"""Loss rules: non-finite values, spikes, plateaus."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from tests.health.synthetic import Run, only, rules

from nbmonitor.health import Alert, Health, Thresholds


def test_loss_non_finite_is_an_error_once() -> None:
    run, health = Run(), Health()
    run.add(30)
    health.check(run.input())
    run.add(1, loss=float("nan"))
    alert = only(health.check(run.input()), "loss_non_finite")
    assert alert.severity == "error" and alert.step == 31 and "nan" in alert.message
    run.add(5, loss=float("nan"))
    assert health.check(run.input()) == []


def test_loss_nan_in_sparsely_logged_column_is_not_reported_but_inf_is() -> None:
    # Logged every 5th step: NaN rows mean "not logged", not "NaN loss".
    run, health = Run(), Health()
    run.add(40)
    inp = run.input()
    sparse = inp.steps["loss"].copy()
    sparse[np.arange(sparse.size) % 5 != 0] = np.nan
    assert health.check(replace(inp, steps={**inp.steps, "loss": sparse})) == []
    run.add(1)
    inp = run.input()
    sparse = np.append(sparse, np.inf)
    alert = only(health.check(replace(inp, steps={**inp.steps, "loss": sparse})), "loss_non_finite")
    assert "inf" in alert.message


def test_a_nan_loss_from_the_first_step_or_early_is_reported_as_inf_is() -> None:
    run, health = Run(), Health()
    run.add(3, loss=float("nan"))  # a model broken from the start: every loss NaN
    alert = only(health.check(run.input()), "loss_non_finite")
    assert alert.step == 1 and "nan" in alert.message
    early, health = Run(), Health()
    early.add(4)
    early.add(1, loss=float("nan"))  # the first check sees steps 1-5: 4 logged, then NaN
    assert only(health.check(early.input()), "loss_non_finite").step == 5


def test_loss_spike_needs_a_few_steps_and_fires_once() -> None:
    run, health = Run(), Health()
    run.add(60, loss=1.0)
    run.loss = [1.0 + 0.05 * math.sin(i) for i in range(60)]
    health.check(run.input())
    run.add(1, loss=20.0)  # one bad batch
    run.add(2, loss=1.0)
    assert health.check(run.input()) == []
    run.add(3, loss=12.0)
    alert = only(health.check(run.input()), "loss_spike")
    assert alert.step == 64 and "12x the recent median" in alert.message
    run.add(2, loss=12.0)
    assert health.check(run.input()) == []


def test_loss_plateau_when_stuck_not_when_converged() -> None:
    rng = np.random.default_rng(1)
    stuck, health = Run(), Health()
    for _ in range(50):
        stuck.add(5)
        stuck.loss[-5:] = list(2.3 + 0.05 * rng.standard_normal(5))
        found = health.check(stuck.input())
        if stuck.step < 200:
            assert found == []
        elif found:
            break
    alert = only(found, "loss_plateau")
    assert alert.step == 200 and "200 steps" in alert.message

    # Falls from 2.3 to 0.1 and flattens there: converged, not stuck.
    converged, health = Run(), Health()
    alerts: list[Alert] = []
    for _ in range(80):
        converged.add(5)
        steps = np.arange(converged.step - 4, converged.step + 1)
        converged.loss[-5:] = list(0.1 + 2.2 * np.exp(-steps / 20) + 0.01 * rng.random(5))
        alerts += health.check(converged.input())
    assert alerts == []


def test_loss_plateau_window_is_configurable() -> None:
    run, health = Run(), Health(Thresholds(plateau_window=40))
    run.add(40, loss=2.0)
    assert rules(health.check(run.input())) == ["loss_plateau"]


def test_small_loss_bump_near_convergence_is_not_a_spike() -> None:
    health, run = Health(), Run()
    run.add(100)
    run.add(100, loss=1e-3)
    health.check(run.input())
    run.add(3, loss=1e-2)  # 10x the median, but 0.4 % of the loss range of the run
    assert "loss_spike" not in rules(health.check(run.input()))
