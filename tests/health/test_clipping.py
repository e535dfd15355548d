"""clipping_active: clip_grad_norm_ scaling the gradients on most steps."""

from __future__ import annotations

import numpy as np
from tests.health.synthetic import Run, only, rules

from nbmonitor.health import Health, Thresholds


def test_clipping_every_step_is_reported_once_within_the_judged_steps() -> None:
    run, health = Run(), Health()
    run.add(45, clip=0.2)
    alert = only(health.check(run.input()), "clipping_active")
    assert alert.step == 40 and alert.subject == "grad_norm"
    assert "100% of the last 40 steps" in alert.message and "max_norm" in alert.message
    run.add(30, clip=0.2)
    assert health.check(run.input()) == []


def test_occasional_clipping_over_a_long_noisy_run_is_silent() -> None:
    rng = np.random.default_rng(3)
    run, health = Run(), Health()
    for _ in range(100):  # 3000 steps, clipped on ~20 % of them, checked every 30 steps
        for _ in range(30):
            run.add(1, clip=float(rng.uniform(0.3, 1.0)) if rng.random() < 0.2 else 1.0)
        assert "clipping_active" not in rules(health.check(run.input()))


def test_few_known_steps_are_not_judged_and_the_share_is_configurable() -> None:
    run = Run()
    run.add(30, clip=0.5)
    assert Health().check(run.input()) == []  # fewer than clip_steps steps that clipped
    run.add(20, clip=1.0)
    run.add(50, clip=0.5)
    assert "clipping_active" not in rules(Health().check(run.input()))  # 80 % of 100
    lenient = Health(Thresholds(clip_fraction=0.7))
    assert rules(lenient.check(run.input())) == ["clipping_active"]
