"""Update-ratio rules: too large and too small, after sustained observations."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from tests.health.synthetic import LAYERS, Run, only

from nbmonitor.health import Alert, Health


def test_update_ratio_high_and_low_name_layers_after_sustained_observations() -> None:
    run, health = Run(), Health()
    run.add(30, loss=1.0)  # a loss that does not fall: large updates are not bringing it down
    alerts: list[Alert] = []
    for i in range(3):
        ratios = np.full(len(LAYERS), 1e-3 * (1 + i / 10))
        ratios[LAYERS.index("fc2.weight")] = 0.5 + i / 10
        ratios[LAYERS.index("fc2.bias")] = 0.9  # biases near zero: never "too high"
        ratios[LAYERS.index("fc3.weight")] = 1e-8
        ratios[LAYERS.index("fc3.bias")] = 0.0  # exactly 0: lr 0 / no grad, the static checks
        run.update_ratios = ratios
        run.add(1, loss=1.0)
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


def test_update_ratio_series_is_judged_in_step_order_from_min_history() -> None:
    # Every measured step is one observation, even when many arrive in one check; steps before
    # min_history are not judged (Adam's first updates move far by design).
    run, health = Run(), Health()
    run.add(40, loss=1.0)
    steps = np.arange(1.0, 41.0)
    series = np.full((len(LAYERS), steps.size), 1e-3)
    series[LAYERS.index("fc1.weight"), :] = 0.5
    series[LAYERS.index("fc2.weight"), :21] = 0.5  # large up to step 21: two judged steps
    inp = replace(run.input(), update_steps=steps, update_series=series)
    high = only(health.check(inp), "update_ratio_high")
    assert high.layers == ("fc1.weight",) and high.step == 22


def test_tiny_updates_at_the_end_of_a_decayed_schedule_are_not_low() -> None:
    run, health = Run(), Health()
    run.add(200)
    inp = run.input()
    lr = np.geomspace(1e-2, 1e-6, inp.steps["step"].size)  # decayed to 1e-4 of its peak
    steps = inp.steps["step"][-5:]
    series = np.full((len(LAYERS), steps.size), 1e-9)
    decayed = replace(inp, steps={**inp.steps, "lr": lr}, update_steps=steps, update_series=series)
    assert health.check(decayed) == []
    flat = replace(decayed, steps={**inp.steps, "lr": np.full(lr.size, 1e-6)})
    assert only(Health().check(flat), "update_ratio_low").step == steps[2]


def test_large_updates_while_the_loss_falls_are_not_too_high() -> None:
    # SGD with momentum early in a healthy run: a small head moves ~15% of its norm per step
    # for a while, and the loss falls fast all along.
    steps = np.arange(1.0, 61.0)
    series = np.full((len(LAYERS), steps.size), 1e-3)
    series[LAYERS.index("fc3.weight"), 20:] = 0.15
    falling = Run()
    for step in range(60):
        falling.add(1, loss=2.0 * 0.97**step)
    inp = replace(falling.input(), update_steps=steps, update_series=series)
    assert Health().check(inp) == []
    # The same updates with a loss that stopped falling: the learning rate is too high.
    flat = Run()
    flat.add(60, loss=1.0)
    inp = replace(flat.input(), update_steps=steps, update_series=series)
    assert only(Health().check(inp), "update_ratio_high").layers == ("fc3.weight",)


def test_a_bias_before_a_norm_layer_is_not_low() -> None:
    # Linear(bias=True) -> BatchNorm1d: the bias's gradient is rounding noise, its update ~0
    # while its weight learns. Zero by construction, as for vanishing_gradients.
    layers = ("fc.weight", "fc.bias", "bn.weight", "bn.bias", "head.weight", "head.bias")
    run, health = Run(layers), Health()
    run.add(30)
    alerts: list[Alert] = []
    for i in range(4):
        ratios = np.full(len(layers), 1e-3 * (1 + i / 10))
        ratios[layers.index("fc.bias")] = 1e-9
        run.update_ratios = ratios
        run.add(1)
        alerts += health.check(run.input())
    assert alerts == []
    # The weight barely moving too: the module's updates are tiny, said.
    for i in range(4):
        ratios = np.full(len(layers), 1e-3 * (1 + i / 10))
        ratios[layers.index("fc.bias")] = ratios[layers.index("fc.weight")] = 1e-9 * (1 + i)
        run.update_ratios = ratios
        run.add(1)
        alerts += health.check(run.input())
    assert only(alerts, "update_ratio_low").layers == ("fc.weight", "fc.bias")
