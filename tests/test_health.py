"""Health rules: each fires on a constructed condition, names the right layers, fires once,
re-arms after clearing, and stays silent on healthy training."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from tests.helpers import mlp

from nbmonitor._engine.frame import Alert
from nbmonitor.health import Health, HealthInput, Thresholds, non_finite_gradients

LAYERS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias")


class Run:
    """A synthetic training run: appends per-step rows and per-layer columns, builds inputs."""

    def __init__(self, layers: tuple[str, ...] = LAYERS, seed: int = 0) -> None:
        self.layers = layers
        self.rng = np.random.default_rng(seed)
        self.step = 0
        self.loss: list[float] = []
        self.grad: list[np.ndarray] = []
        self.param_norms = np.ones(len(layers))
        self.update_ratios = np.full(len(layers), np.nan)
        self.activations: dict[str, dict[str, float]] | None = None
        self.system: dict[str, np.ndarray] | None = None

    def add(self, n: int = 1, *, loss: float | None = None, **layer_norm: float) -> None:
        """n steps of healthy noise; ``loss`` and ``fc3_weight=...`` override values."""
        for _ in range(n):
            self.step += 1
            level = 2.0 * math.exp(-self.step / 150) + 0.3
            self.loss.append(
                loss if loss is not None else level * float(self.rng.lognormal(0, 0.1))
            )
            norms = self.rng.lognormal(0, 0.2, len(self.layers))
            for key, value in layer_norm.items():
                norms[self.layers.index(key.replace("_", "."))] = value
            self.grad.append(norms)

    def input(self, window: int = 300) -> HealthInput:
        grads = np.array(self.grad[-window:]).T
        loss = np.array(self.loss[-window:])
        steps = np.arange(self.step - loss.size + 1, self.step + 1, dtype=np.float64)
        # As the engine does: the total covers the parameters that had a gradient; an Inf
        # gradient makes it non-finite.
        squares = grads**2
        total = np.sqrt(np.nansum(squares, axis=0))
        total[np.isinf(squares).any(axis=0)] = np.inf
        return HealthInput(
            step=self.step,
            time=1000.0 + self.step,
            steps={"step": steps, "time": 1000.0 + steps, "loss": loss, "grad_norm": total},
            layer_names=self.layers,
            layer_steps=steps,
            layer_grad_norms=grads,
            param_norms=self.param_norms,
            update_ratios=self.update_ratios,
            activations=self.activations,
            system=self.system,
        )


def rules(alerts: list[Alert]) -> list[str]:
    return [a.rule for a in alerts]


def only(alerts: list[Alert], rule: str) -> Alert:
    found = [a for a in alerts if a.rule == rule]
    assert len(found) == 1, alerts
    return found[0]


# -- healthy training: no false positives ------------------------------------------------------


def test_healthy_synthetic_run_raises_nothing() -> None:
    health, run = Health(), Run()
    run.activations = {"act1": {"zero_frac": 0.5}, "act2": {"zero_frac": 0.45}}
    run.system = {"step": np.arange(10.0), "gpu0_temperature_c": np.full(10, 60.0)}
    alerts: list[Alert] = []
    for _ in range(60):
        run.add(5)
        run.update_ratios = run.rng.lognormal(np.log(1e-3), 0.3, len(LAYERS))
        alerts += health.check(run.input())
    assert run.step == 300
    assert alerts == []


@pytest.mark.parametrize("every", [1, 7, 50])
def test_healthy_real_training_raises_nothing(every: int) -> None:
    # The lead's engine test trains helpers.mlp like this; batch 4 gives heavy-tailed per-step
    # losses and grad norms (single steps 20x the median), which must not read as problems.
    for seed in range(3):
        torch.manual_seed(seed)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        params = list(model.parameters())
        names = tuple(n for n, _ in model.named_parameters())
        health = Health()
        rows: dict[str, list[float]] = {"step": [], "loss": [], "grad_norm": []}
        layer: list[list[float]] = []
        alerts: list[Alert] = []
        for step in range(1, 301):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            norms = [float(p.grad.norm()) for p in params]  # type: ignore[union-attr]
            before = [p.detach().clone() for p in params]
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                ratios = [
                    float((p - b).norm() / p.norm()) for p, b in zip(params, before, strict=True)
                ]
            rows["step"].append(step)
            rows["loss"].append(loss.item())
            rows["grad_norm"].append(float(np.linalg.norm(norms)))
            layer.append(norms)
            if step % every == 0:
                cols = {k: np.array(v, dtype=np.float64) for k, v in rows.items()}
                inp = HealthInput(
                    step=step,
                    time=float(step),
                    steps=cols,
                    layer_names=names,
                    layer_steps=cols["step"],
                    layer_grad_norms=np.array(layer).T,
                    param_norms=np.array([float(p.detach().norm()) for p in params]),
                    update_ratios=np.array(ratios),
                )
                alerts += health.check(inp)
        assert alerts == [], (seed, alerts)


# -- exploding gradients ------------------------------------------------------------------------


def test_exploding_names_layers_fires_once_and_rearms() -> None:
    health, run = Health(Thresholds(rearm_steps=30)), Run()
    run.add(120)
    assert health.check(run.input()) == []
    run.add(3, fc3_weight=50.0, fc3_bias=60.0)
    alerts = health.check(run.input())
    alert = only(alerts, "exploding_gradients")
    assert alert.layers == ("fc3.weight", "fc3.bias")
    assert alert.step == 121 and alert.time == 1000.0 + 121
    assert alert.severity == "warning"
    assert "fc3.weight, fc3.bias" in alert.message and "clip_grad_norm_" in alert.message
    assert "\n" not in alert.message
    # Still exploding: no repeat.
    run.add(3, fc3_weight=50.0, fc3_bias=60.0)
    assert "exploding_gradients" not in rules(health.check(run.input()))
    # Clear for less than rearm_steps, then again: still no repeat.
    run.add(10)
    assert health.check(run.input()) == []
    run.add(3, fc3_weight=50.0, fc3_bias=60.0)
    assert "exploding_gradients" not in rules(health.check(run.input()))
    # Clear for longer than rearm_steps (checked every few steps), then a new, larger
    # explosion (one that beats the run's maximum): alerts again.
    for _ in range(8):
        run.add(5)
        assert health.check(run.input()) == []
    run.add(3, fc3_weight=500.0)
    again = only(health.check(run.input()), "exploding_gradients")
    assert again.layers == ("fc3.weight",)


def test_exploding_needs_a_sustained_rise_and_history() -> None:
    health, run = Health(), Run()
    run.add(60)
    health.check(run.input())
    run.add(1, fc2_weight=50.0)  # a single bad batch
    run.add(2)
    assert health.check(run.input()) == []
    # Too little history for a running median: nothing is judged.
    short, fresh = Health(), Run()
    fresh.add(10)
    fresh.add(3, fc2_weight=50.0)
    assert short.check(fresh.input()) == []


def test_explode_abs_threshold_is_configurable() -> None:
    run = Run()
    run.add(5)
    run.add(3, fc1_weight=6.0)
    assert Health().check(run.input()) == []  # 6x, and too little history for the median
    alert = only(Health(Thresholds(explode_abs=5.0)).check(run.input()), "exploding_gradients")
    assert alert.layers == ("fc1.weight",)
    assert "above the limit 5" in alert.message


def test_exploding_total_grad_norm_without_layers() -> None:
    run, health = Run(), Health()
    run.add(120)
    inp = run.input()
    grad = inp.steps["grad_norm"].copy()
    grad[-3:] *= 40
    only_total = replace(inp, steps={**inp.steps, "grad_norm": grad}, layer_grad_norms=None)
    alert = only(health.check(only_total), "exploding_gradients")
    assert alert.layers == ()
    assert alert.message.startswith("Total gradient norm exploding")


def test_long_layer_lists_are_cut_in_the_message_but_kept_in_layers() -> None:
    names = tuple(f"block{i}.weight" for i in range(12))
    run, health = Run(names), Health()
    run.add(120)
    health.check(run.input())
    exploding: dict[str, float] = {f"block{i}_weight": 100.0 for i in range(12)}
    run.add(3, **exploding)  # type: ignore[arg-type]
    alert = only(health.check(run.input()), "exploding_gradients")
    assert alert.layers == names
    assert "and 7 more" in alert.message and "block5.weight" not in alert.message


# -- vanishing gradients ------------------------------------------------------------------------


def test_vanishing_after_enough_consecutive_steps() -> None:
    run, health = Run(), Health()
    run.param_norms = np.full(len(LAYERS), 10.0)
    run.add(40)
    run.add(19, fc1_weight=1e-9)
    assert health.check(run.input()) == []
    run.add(1, fc1_weight=1e-9)
    alert = only(health.check(run.input()), "vanishing_gradients")
    assert alert.layers == ("fc1.weight",)
    assert "fc1.weight" in alert.message
    run.add(5, fc1_weight=1e-9)
    assert health.check(run.input()) == []


def test_vanishing_ignores_unknown_param_norms() -> None:
    run, health = Run(), Health()
    run.param_norms = np.full(len(LAYERS), np.nan)
    run.add(40, fc1_weight=1e-12)
    assert health.check(run.input()) == []


# -- update ratios ------------------------------------------------------------------------------


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


# -- non-finite loss and gradients --------------------------------------------------------------


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


def test_non_finite_gradient_report_names_parameters_and_module() -> None:
    names = [f"block{i}.weight" for i in range(8)]
    plain = non_finite_gradients(12, 5.0, names)
    assert (plain.rule, plain.severity, plain.step, plain.time) == (
        "grad_non_finite",
        "error",
        12,
        5.0,
    )
    assert plain.layers == tuple(names)
    assert (
        "first in block0.weight, block1.weight" in plain.message and "and 3 more" in plain.message
    )
    assert "check_forward=True" in plain.message
    forward = non_finite_gradients(12, 5.0, names[:1], (11, "encoder.2", (0.5, 2.0, 1e30)))
    assert "non-finite output was 'encoder.2' at step 11" in forward.message
    assert "max |x| 1e+30" in forward.message
    checked = non_finite_gradients(12, 5.0, names[:1], None, forward_checked=True)
    assert "Every module's forward output was finite" in checked.message


# -- loss shape ---------------------------------------------------------------------------------


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


# -- activations and devices --------------------------------------------------------------------


def test_dead_units_names_modules_after_warmup() -> None:
    run, health = Run(), Health()
    run.activations = {"net.1": {"zero_frac": 1.0}, "net.3": {"zero_frac": 0.5}}
    run.add(5)
    assert health.check(run.input()) == []  # zero-initialised branches are dead at first
    run.add(20)
    alert = only(health.check(run.input()), "dead_units")
    assert alert.layers == ("net.1",) and "net.1" in alert.message
    run.add(1)
    assert health.check(run.input()) == []
    lenient = Health(Thresholds(dead_fraction=1.0))
    run.activations = {"net.1": {"zero_frac": 0.995}}
    assert lenient.check(run.input()) == []


def test_device_rules_pass_through_once() -> None:
    run, health = Run(), Health()
    run.add(30)
    run.system = {
        "step": np.array([29.0, 30.0]),
        "time": np.array([5.0, 6.0]),
        "gpu0_util_percent": np.array([99.0, 99.0]),
        "gpu0_temperature_c": np.array([80.0, 90.0]),
        "gpu1_util_percent": np.array([99.0, 99.0]),
        "gpu1_temperature_c": np.array([60.0, 60.0]),
    }
    alert = only(health.check(run.input()), "gpu_temperature")
    assert alert.message.startswith("GPU 0") and alert.step == 30
    run.add(1)
    assert health.check(run.input()) == []
    assert Health(Thresholds(temperature_c=95.0)).check(run.input()) == []


# -- plumbing -----------------------------------------------------------------------------------


def test_no_new_data_judges_nothing() -> None:
    run, health = Run(), Health()
    run.add(120)
    run.add(3, fc3_weight=80.0)
    inp = run.input()
    assert rules(health.check(inp)) == ["exploding_gradients"]
    assert health.check(inp) == []
    health.reset()
    assert rules(health.check(inp)) == ["exploding_gradients"]


def test_missing_and_nan_columns_are_ignored() -> None:
    health = Health()
    empty = HealthInput(step=0, time=0.0, steps={})
    assert health.check(empty) == []
    nan = np.full(100, np.nan)
    inp = HealthInput(
        step=100,
        time=0.0,
        steps={"step": np.arange(1.0, 101.0), "loss": nan, "grad_norm": nan},
        layer_names=("a",),
        layer_steps=np.arange(1.0, 101.0),
        layer_grad_norms=nan[None, :],
        param_norms=np.array([np.nan]),
        update_ratios=np.array([np.nan]),
    )
    assert health.check(inp) == []


@pytest.mark.parametrize(
    "field, value",
    [("explode_factor", 0.0), ("vanish_steps", 0), ("dead_fraction", 1.5), ("window", 0)],
)
def test_thresholds_are_validated(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Thresholds(**{field: value})  # type: ignore[arg-type]


def test_check_is_cheap_for_hundreds_of_layers() -> None:
    import time

    names = tuple(f"layer{i}.weight" for i in range(300))
    run = Run(names)
    run.add(300)
    run.update_ratios = np.full(300, 1e-3)
    health = Health()
    inp = run.input()
    health.check(inp)
    start = time.perf_counter()
    for _ in range(10):
        run.add(5)
        health.check(run.input())
    assert (time.perf_counter() - start) / 10 < 0.05


def test_fluctuations_after_convergence_are_not_explosions() -> None:
    # Gradients fall 1000x as the model converges, then jitter 10-20x around the new median:
    # nothing there beats the norms seen while learning, so nothing is exploding.
    health, run = Health(), Run()
    run.add(150)
    run.add(150, fc3_weight=1e-3)
    health.check(run.input())
    run.add(3, fc3_weight=2e-2)
    assert "exploding_gradients" not in rules(health.check(run.input()))


def test_small_loss_bump_near_convergence_is_not_a_spike() -> None:
    health, run = Health(), Run()
    run.add(100)
    run.add(100, loss=1e-3)
    health.check(run.input())
    run.add(3, loss=1e-2)  # 10x the median, but 0.4 % of the loss range of the run
    assert "loss_spike" not in rules(health.check(run.input()))


def test_rise_early_in_the_run_is_not_judged_by_a_later_check() -> None:
    # Checks come every few dozen steps: a warm-up rise at step 61 is judged at a check made
    # at step 110, but it began before the run was a full window old, so it is no explosion.
    health, run = Health(), Run()
    run.add(60)
    health.check(run.input())
    run.add(3, fc3_weight=50.0)
    run.add(47)
    assert "exploding_gradients" not in rules(health.check(run.input()))
