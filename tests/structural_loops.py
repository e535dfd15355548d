"""Tiny real torch training loops, one per structural cause and per healthy pattern it must
stay silent on (tests/capture/test_structure.py, tests/health/test_structural_causes.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import nbmonitor
from nbmonitor.health import Alert
from nbmonitor.health.structure import Structure

STEPS = 40


def mlp(dropout: float | None = None, bn: bool = False, out: int = 3) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(8, 32)]
    if bn:
        layers.append(nn.BatchNorm1d(32))
    layers.append(nn.ReLU())
    if dropout is not None:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(32, out))
    return nn.Sequential(*layers)


def batch(n: int = 32, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 8) * scale
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return x, y


Loop = Callable[[nn.Module, torch.optim.Optimizer, int], None]


def run(
    tmp: Path,
    loop: Loop,
    model: nn.Module | None = None,
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
    steps: int = STEPS,
    **options: Any,
) -> tuple[list[Alert], Structure]:
    """Train ``loop`` under a monitor; the alerts it raised and the structure it read."""
    torch.manual_seed(0)
    model = model if model is not None else mlp()
    opt = (optimizer or (lambda m: torch.optim.Adam(m.parameters(), lr=1e-3)))(model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    mon = nbmonitor.attach(model, opt, run_dir=tmp, display=False, interval=3600, **options)
    try:
        loop(model, opt, steps)
        mon.flush()
        structure = mon.internals.pipeline.model.structure.snapshot() or Structure()
        return list(mon.events()), structure
    finally:
        torch.set_num_threads(threads)
        mon.close()


def ce(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


# -- the loops -----------------------------------------------------------------------------------


def healthy(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        ce(model, x, y).backward()
        opt.step()


def no_zero_grad(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        ce(model, x, y).backward()
        opt.step()


def zero_grad_between(set_to_none: bool = True) -> Loop:
    def loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
        for _ in range(steps):
            x, y = batch()
            ce(model, x, y).backward()
            opt.zero_grad(set_to_none=set_to_none)
            opt.step()

    return loop


def step_first(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        loss = ce(model, x, y)
        opt.step()
        loss.backward()


def item_loss(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        loss = ce(model, x, y)
        torch.tensor(loss.item(), requires_grad=True).backward()
        opt.step()


def no_grad_forward(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        with torch.no_grad():
            loss = ce(model, x, y)
        loss.requires_grad_()
        loss.backward()
        opt.step()


def softmax_ce(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        nn.functional.cross_entropy(torch.softmax(model(x), dim=-1), y).backward()
        opt.step()


def log_softmax_nll(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        nn.functional.nll_loss(torch.log_softmax(model(x), dim=-1), y).backward()
        opt.step()


def sigmoid_bce_logits(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        target = (y > 0).float()
        out = torch.sigmoid(model(x)[:, 0])
        nn.functional.binary_cross_entropy_with_logits(out, target).backward()
        opt.step()


def regression_sum(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(64, 8)
        y = x[:, :1] * 2.0
        opt.zero_grad()
        nn.functional.mse_loss(model(x)[:, :1], y, reduction="sum").backward()
        opt.step()


def scaled_inputs(scale: float) -> Loop:
    def loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
        for _ in range(steps):
            x, y = batch(scale=1.0)
            opt.zero_grad()
            ce(model, x.abs() * scale, y).backward()
            opt.step()

    return loop


def left_in_eval(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    model.eval()
    healthy(model, opt, steps)


def with_eval_passes(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        x, y = batch()
        opt.zero_grad()
        ce(model, x, y).backward()
        opt.step()
        if step % 5 == 4:
            model.eval()
            with torch.no_grad():
                ce(model, *batch(1))
            model.train()


def batches_of(n: int) -> Loop:
    def loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
        for _ in range(steps):
            x, y = batch(n)
            opt.zero_grad()
            ce(model, x, y).backward()
            opt.step()

    return loop


def accumulate(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        for _ in range(4):
            x, y = batch(8)
            (ce(model, x, y) / 4).backward()
        opt.step()
        opt.zero_grad()


def zero_in_place(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        ce(model, x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


def model_zero_grad(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        model.zero_grad()
        ce(model, x, y).backward()
        opt.step()


def clipped(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        ce(model, x, y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def value_clipped(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad(set_to_none=False)
        ce(model, x, y).backward()
        nn.utils.clip_grad_value_(model.parameters(), 0.01)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def zero_gradient(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    """A loss whose gradient is exactly 0 for every parameter (a constant output)."""
    for _ in range(steps):
        x, _ = batch()
        opt.zero_grad(set_to_none=False)
        (model(x) * 0.0).sum().backward()
        opt.step()


def autocast(dtype: torch.dtype, scaler: bool = False) -> Loop:
    def loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
        amp = torch.amp.GradScaler("cpu") if scaler else None
        for _ in range(steps):
            x, y = batch()
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype):
                loss = ce(model, x, y)
            if amp is not None:
                amp.scale(loss).backward()
                amp.step(opt)
                amp.update()
            else:
                loss.backward()
                opt.step()

    return loop


def half_params(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x.half()).float(), y).backward()
        opt.step()
