"""Long noisy healthy series raise nothing, whatever the check cadence; the same series with
one bug in it raise the right rule at the right step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.health.synthetic import LAYERS, Run, rules

from nbmonitor.health import Health, HealthInput


class Converging(Run):
    """A run that converges over thousands of steps: the loss falls 1e5-fold, gradient norms
    1000-fold, with heavy-tailed small-batch noise on both; update ratios around 1e-3."""

    def add(self, n: int = 1, **kwargs: float) -> None:  # type: ignore[override]
        for _ in range(n):
            decay = math.exp(-(self.step + 1) / 600)
            loss = (2.0 * decay + 1e-5) * float(self.rng.lognormal(0, 0.4))
            scale = 1e-3 + decay
            norms = {
                name.replace(".", "_"): scale * float(self.rng.lognormal(0, 0.6))
                for name in self.layers
            }
            norms.update(kwargs)
            loss = norms.pop("loss", loss)
            super().add(1, loss=loss, **norms)

    def input(self, window: int = 600) -> HealthInput:
        self.update_ratios = 1e-3 * self.rng.lognormal(0, 0.3, len(self.layers))
        return super().input(window)


@pytest.mark.parametrize(("every", "steps"), [(7, 2000), (50, 6000), (333, 6000)])
def test_a_long_converging_run_raises_nothing(every: int, steps: int) -> None:
    run, health = Converging(seed=every), Health()
    run.param_norms = np.full(len(LAYERS), 5.0)
    run.activations = {"act1": {"zero_frac": 0.6}}
    alerts = []
    while run.step < steps:
        run.add(every)
        alerts += health.check(run.input())
    assert alerts == []


def test_an_explosion_late_in_the_long_run_is_named_where_it_starts() -> None:
    run, health = Converging(seed=5), Health()
    run.param_norms = np.full(len(LAYERS), 5.0)
    while run.step < 4000:
        run.add(40)
        assert health.check(run.input()) == []
    run.add(17)
    run.add(5, fc2_weight=30.0)  # 30x the run's starting scale, 10^4x the recent median
    run.add(18)
    found = [a for a in health.check(run.input()) if a.rule == "exploding_gradients"]
    assert [(a.step, a.layers) for a in found] == [(4018, ("fc2.weight",))]


def test_a_loss_spike_late_in_the_long_run_is_judged_against_its_own_noise() -> None:
    run, health = Converging(seed=6), Health()
    while run.step < 3000:
        run.add(50)
        assert "loss_spike" not in rules(health.check(run.input()))
    # 10x the converged loss is noise-sized against the run's range: no spike ...
    level = float(np.median(run.loss[-100:]))
    run.add(3, loss=10 * level)
    assert "loss_spike" not in rules(health.check(run.input()))
    # ... a loss back at half its starting level is one.
    run.add(30)
    health.check(run.input())
    run.add(4, loss=1.0)
    assert "loss_spike" in rules(health.check(run.input()))
