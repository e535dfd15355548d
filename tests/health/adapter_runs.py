"""Synthetic fine-tunes for the fine-tuning rules: two LoRA layers (A random, B from zero) on a
frozen base, with their update steps, parameter norms and gradient norms as the engine hands
them to the rules."""

from __future__ import annotations

import math

import numpy as np

from nbmonitor.health import HealthInput
from nbmonitor.health.adapters import Adapters, AdapterTensor

NAMES = ("l0.lora_A.weight", "l0.lora_B.weight", "l1.lora_A.weight", "l1.lora_B.weight")


def lora_adapters(lr: float = 1e-3, trainable: bool = True, in_optimizer: bool = True) -> Adapters:
    tensors = tuple(
        AdapterTensor(
            name=name,
            role="A" if "lora_A" in name else "B",
            module=name.split(".")[0],
            numel=128,
            trainable=trainable,
            in_optimizer=in_optimizer,
            group=0 if in_optimizer else -1,
            lr=lr,
            zero_start="lora_B" in name,
        )
        for name in NAMES
    )
    return Adapters("LoRA", tensors, base_numel=4096, base_trainable_numel=0)


def lora_input(
    steps: int,
    *,
    b_step: float,
    a_ratio: float,
    grad: float,
    loss: float | None = None,
    adapters: Adapters | None = None,
    lr: float | None = None,
    head: bool = True,
) -> HealthInput:
    """``steps`` steps, each measured: B grows by ``b_step`` a step from zero, A moves by
    ``a_ratio`` of its norm a step, every adapter's gradient norm is ``grad`` (NaN: none).
    With ``head``, a head (``head.weight``) trains beside them, healthy. The loss falls as
    1/sqrt(step) unless ``loss`` fixes it."""
    s = np.arange(1.0, steps + 1)
    names = (*NAMES, "head.weight") if head else NAMES
    n = len(names)
    b_norm = b_step * (s - 1)  # before each step's update
    norms = np.empty((n, steps))
    ratios = np.empty((n, steps))
    for i, name in enumerate(names):
        if name == "head.weight":
            norms[i] = 1.0
            ratios[i] = 1e-3
        elif "lora_B" in name:
            norms[i] = b_norm
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios[i] = np.where(b_norm > 0, b_step / b_norm, np.nan)
        else:
            norms[i] = 1.0
            ratios[i] = a_ratio
    grads = np.full((n, steps), grad)
    if head:
        grads[-1] = 0.5
    losses = np.full(steps, loss) if loss is not None else 2.0 / np.sqrt(s)
    columns = {"step": s, "time": 1000.0 + s, "loss": losses}
    if lr is not None:
        columns["lr"] = np.full(steps, lr)
    return HealthInput(
        step=steps,
        time=1000.0 + steps,
        steps=columns,
        layer_names=names,
        layer_steps=s,
        layer_grad_norms=grads,
        param_norms=norms[:, -1],
        update_ratios=ratios[:, -1],
        update_steps=s,
        update_series=ratios,
        param_series=norms,
        adapters=adapters if adapters is not None else lora_adapters(),
    )


def healthy(steps: int = 60) -> HealthInput:
    return lora_input(steps, b_step=1e-3, a_ratio=1e-3, grad=0.5)


def stuck(steps: int = 60, grad: float = math.nan) -> HealthInput:
    """B never leaves zero, A never moves."""
    return lora_input(steps, b_step=0.0, a_ratio=0.0, grad=grad, loss=1.0)


def too_slow(steps: int = 60) -> HealthInput:
    """Adam at lr 1e-9: B creeps off zero, A moves 1e-9 of its norm a step; the loss is flat."""
    return lora_input(steps, b_step=1e-9, a_ratio=1e-9, grad=0.5, loss=1.0)
