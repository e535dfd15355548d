"""Small models and loops shared by the engine tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# How long a test waits for a condition (a thread to end, a sample to arrive, a status to
# change) before failing: generous, so that a loaded machine only makes the wait longer, never
# the verdict different (docs/testing.md). Waits end as soon as the condition holds.
WAIT_S = 120.0


def wait_for(condition: Callable[[], object], timeout: float = WAIT_S) -> bool:
    """Poll ``condition`` until it is true or ``timeout`` seconds have passed; its last value."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(condition())


def mlp(
    width: int = 8, depth: int = 2, activation: type[torch.nn.Module] = torch.nn.ReLU
) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), activation()]
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers)


def train(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mon: object,
    steps: int,
    batch: int = 4,
    width: int = 8,
    accumulate: int = 1,
) -> list[float]:
    losses = []
    for _ in range(steps):
        for _ in range(accumulate):
            x = torch.randn(batch, width)
            loss = model(x).pow(2).mean()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mon.log(loss=loss)  # type: ignore[attr-defined]
        losses.append(loss.item())
    return losses


@dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


class HFStyle(torch.nn.Module):
    """Returns an object with ``.loss`` like a Hugging Face model given labels."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Output:
        logits = self.lin(input_ids)
        return Output(torch.nn.functional.cross_entropy(logits, labels), logits)


def hook_counts(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    n = len(model._forward_pre_hooks) + len(model._forward_hooks)
    if optimizer is not None:
        n += len(optimizer._optimizer_step_pre_hooks) + len(optimizer._optimizer_step_post_hooks)
    return n
