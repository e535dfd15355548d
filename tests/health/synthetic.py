"""A synthetic training run for the health-rule tests, and small alert helpers."""

from __future__ import annotations

import math

import numpy as np

from nbmonitor.health import Alert, HealthInput

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
        self.clip_coef: list[float] = []
        self.skipped: list[float] = []
        self.module_kinds: dict[str, str] | None = None

    def add(
        self,
        n: int = 1,
        *,
        loss: float | None = None,
        clip: float = math.nan,
        skipped: bool = False,
        **layer_norm: float,
    ) -> None:
        """n steps of healthy noise; ``loss`` and ``fc3_weight=...`` override values, ``clip``
        is the step's grad_clip_coef and ``skipped`` marks a step the GradScaler skipped."""
        for _ in range(n):
            self.step += 1
            self.clip_coef.append(clip)
            self.skipped.append(1.0 if skipped else math.nan)
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
        columns = {"step": steps, "time": 1000.0 + steps, "loss": loss, "grad_norm": total}
        for key, values in (("grad_clip_coef", self.clip_coef), ("step_skipped", self.skipped)):
            if any(not math.isnan(v) for v in values):
                columns[key] = np.array(values[-window:])
        return HealthInput(
            step=self.step,
            time=1000.0 + self.step,
            steps=columns,
            module_kinds=self.module_kinds,
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
