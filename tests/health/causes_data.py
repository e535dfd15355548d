"""Synthetic runs for the causes judged from the numbers (learning rate, schedule, labels,
weight decay): every column the rules read, built from a few curves."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from nbmonitor.health import HealthInput

LAYERS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias")
Curve = Callable[[np.ndarray], np.ndarray]


def measured(n: int) -> np.ndarray:
    """The steps update ratios are measured at (as the engine does: every step to 8, then 4 a
    doubling of the step count up to step 100, then every 100th)."""

    def early(s: int) -> bool:
        gap = (1 << ((s - 1).bit_length() - 1)) // 4
        return s <= 100 and s % gap == 0

    steps = [s for s in range(1, n + 1) if s <= 8 or s % 100 == 0 or early(s)]
    return np.array(steps, dtype=np.float64)


def run(
    n: int,
    *,
    loss: Curve,
    lr: Curve = lambda s: np.full(s.size, 1e-3),
    ratio: Curve = lambda s: np.full(s.size, 1e-3),
    norm: Curve = lambda s: np.ones(s.size),
    grad: Curve = lambda s: np.full(s.size, 0.1),
    total_steps: int | None = None,
    seed: int = 0,
) -> HealthInput:
    """``n`` steps: ``loss(steps)`` (times a little noise), ``lr``, and every layer's update
    ratio, parameter norm and gradient norm as curves over the steps."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1.0, n + 1)
    at = measured(n)
    k = len(LAYERS)
    grads = np.tile(grad(steps), (k, 1)) * rng.lognormal(0, 0.1, (k, n))
    return HealthInput(
        step=n,
        time=1000.0 + n,
        steps={
            "step": steps,
            "time": 1000.0 + steps,
            "loss": loss(steps) * rng.lognormal(0, 0.02, n),
            "lr": lr(steps),
            "grad_norm": np.sqrt((grads**2).sum(axis=0)),
        },
        layer_names=LAYERS,
        layer_steps=steps,
        layer_grad_norms=grads,
        param_norms=np.full(k, float(norm(at[-1:])[0])),
        update_ratios=np.full(k, float(ratio(at[-1:])[0])),
        update_steps=at,
        update_series=np.tile(ratio(at), (k, 1)),
        param_series=np.tile(norm(at), (k, 1)),
        total_steps=total_steps,
    )


def flat(value: float = 1.0) -> Curve:
    return lambda s: np.full(s.size, value)


def falling(start: float = 1.0, steps: float = 100.0) -> Curve:
    return lambda s: start * np.exp(-s / steps) + 0.01


def schedule_per_batch(gamma: float = 0.9, total: int = 1000) -> HealthInput:
    """ExponentialLR(gamma) meant per epoch, stepped every batch: the lr is ~0 by step
    ln(1e-3)/ln(gamma), the loss stops there."""
    return run(
        300,
        loss=lambda s: 0.3 + 0.7 * np.exp(-np.minimum(s, 60) / 30),
        lr=lambda s: 0.1 * gamma**s,
        ratio=lambda s: 1e-3 * gamma**s,
        total_steps=total,
    )


def lr_high(loss_climbs: bool = True) -> HealthInput:
    """Every layer moves half its size a step from the first steps; the loss then climbs to
    5x where it started (or falls)."""
    climb: Curve = lambda s: np.where(s >= 8, 5.0, 1.0)  # noqa: E731
    return run(60, loss=climb if loss_climbs else falling(1.0, 20.0), ratio=flat(0.5), lr=flat(1.0))


def lr_low(ratio: float = 1e-9, lr: float = 1e-9) -> HealthInput:
    """A learning rate of ``lr`` moving the weights by ``ratio`` a step, gradients 0.1 a layer,
    parameter norms 1, the loss where it started."""
    return run(60, loss=flat(1.0), lr=flat(lr), ratio=flat(ratio))


def labels(ratio: float = 1e-3, classes: int = 4) -> HealthInput:
    """The loss at ln(classes) for 300 steps while the weights move by ``ratio`` a step."""
    return run(300, loss=flat(math.log(classes)), ratio=flat(ratio))


def weight_decay(loss: Curve | None = None, shrink: float = 0.05) -> HealthInput:
    """Every weight shrinks by ``shrink`` a step, which is the whole update."""
    return run(
        120,
        loss=loss if loss is not None else flat(1.0),
        ratio=flat(shrink),
        norm=lambda s: 2.0 * (1 - shrink) ** s,
        lr=flat(0.05),
    )


__all__ = [
    "LAYERS",
    "falling",
    "flat",
    "labels",
    "lr_high",
    "lr_low",
    "measured",
    "run",
    "schedule_per_batch",
    "weight_decay",
]
