"""Update-ratio rules: too large and too small, after sustained observations."""

from __future__ import annotations

import numpy as np
from tests.health.synthetic import LAYERS, Run, only

from nbmonitor.health import Alert, Health


def test_update_ratio_high_and_low_name_layers_after_sustained_observations() -> None:
    run, health = Run(), Health()
    run.add(30)
    alerts: list[Alert] = []
    for i in range(3):
        ratios = np.full(len(LAYERS), 1e-3 * (1 + i / 10))
        ratios[LAYERS.index("fc2.weight")] = 0.5 + i / 10
        ratios[LAYERS.index("fc2.bias")] = 0.9  # biases near zero: never "too high"
        ratios[LAYERS.index("fc3.weight")] = 1e-8
        ratios[LAYERS.index("fc3.bias")] = 0.0  # exactly 0: lr 0 / no grad, the static checks
        run.update_ratios = ratios
        run.add(1)
        alerts += health.check(run.input())
        if i < 2:
            assert alerts == []  # one or two observations are not enough
    high = only(alerts, "update_ratio_high")
    low = only(alerts, "update_ratio_low")
    assert high.layers == ("fc2.weight",) and "learning rate too high?" in high.message
    assert low.layers == ("fc3.weight",) and "too low, or parameters not really training?" in (
        low.message
    )
    # The same array again is not a new observation, and a continuing condition is silent.
    run.add(1)
    assert health.check(run.input()) == []
    run.update_ratios = run.update_ratios * 1.01
    run.add(1)
    assert health.check(run.input()) == []


def test_update_ratio_low_skips_layers_without_gradient() -> None:
    run, health = Run(), Health()
    run.add(30)
    alerts: list[Alert] = []
    for i in range(4):
        run.update_ratios = np.full(len(LAYERS), 1e-9 * (1 + i))
        run.add(1, fc1_weight=float("nan"))
        alerts += health.check(run.input())
    low = only(alerts, "update_ratio_low")
    assert "fc1.weight" not in low.layers and len(low.layers) == len(LAYERS) - 1
