"""Health as a whole: silent on healthy training, judges only new data, resets, tolerates
missing columns, validates its thresholds, and stays cheap."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.health.synthetic import LAYERS, Run, rules
from tests.helpers import mlp

from nbmonitor.health import Alert, Health, HealthInput, Thresholds


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


def test_no_new_data_judges_nothing() -> None:
    run, health = Run(), Health()
    run.add(120)
    run.add(3, fc3_weight=80.0)
    inp = run.input()
    # Its first step is a spike too, named at that step (a slice earlier: the synthetic run
    # takes a second a step, and the time grid cuts every GRID_SECONDS).
    assert rules(health.check(inp)) == ["gradient_spike", "exploding_gradients"]
    assert health.check(inp) == []
    health.reset()
    assert rules(health.check(inp)) == ["gradient_spike", "exploding_gradients"]


def test_missing_and_nan_columns_are_ignored() -> None:
    health = Health()
    empty = HealthInput(step=0, time=0.0, steps={})
    assert health.check(empty) == []
    nan = np.full(100, np.nan)
    inp = HealthInput(
        step=100,
        time=0.0,
        # No loss column: one that holds only NaN from the first check is a NaN loss logged
        # (tests/health/test_loss.py), not a missing one.
        steps={"step": np.arange(1.0, 101.0), "grad_norm": nan},
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
    # CPU time of this thread: another process competing for the machine does not count.
    cpu = 0.0
    for _ in range(10):
        run.add(5)
        inp = run.input()
        start = time.thread_time()
        health.check(inp)
        cpu += time.thread_time() - start
    assert cpu / 10 < 0.05
