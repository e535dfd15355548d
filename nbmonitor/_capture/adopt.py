"""``attach(model)`` without an optimizer: the first optimizer that steps one of the model's
parameters becomes the monitor's (an optimizer created after attach, as the Hugging Face
Trainer builds its own inside ``train()``), found by one of torch's global optimizer step
pre-hooks. From that step on, steps are that optimizer's steps; before it, backward passes.

The global hook holds the step clock weakly (a dropped model still goes) and is removed with
the clock's other hooks at close. Optimizers of other parameters are remembered (weakly) and
not looked at again.
"""

from __future__ import annotations

import weakref
from collections.abc import Set
from typing import Any, Protocol

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle


class Adopter(Protocol):
    optimizer: torch.optim.Optimizer | None

    def adopt(self, optimizer: torch.optim.Optimizer) -> bool:
        """If ``optimizer`` steps its parameters (``steps_any``), register its own hooks on it
        (they run from this step on) and return True; never raises."""


def steps_any(optimizer: torch.optim.Optimizer, param_ids: Set[int]) -> bool:
    """Whether ``optimizer`` holds any of the parameters in ``param_ids``."""
    return any(id(p) in param_ids for group in optimizer.param_groups for p in group["params"])


def watch_optimizers(clock: Adopter) -> list[RemovableHandle]:
    """Offer ``clock.adopt`` each optimizer that steps until it adopts one."""
    ref = weakref.ref(clock)
    others: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()

    def pre(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        held = ref()
        if held is None or held.optimizer is not None or optimizer in others:
            return
        # The optimizer's own hooks added now still run in this step (torch runs them after
        # the global ones).
        if not held.adopt(optimizer):
            others.add(optimizer)

    return [register_optimizer_step_pre_hook(pre)]


def watching() -> int:
    """How many global optimizer pre-step hooks are registered (tests: none left behind)."""
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    return len(_global_optimizer_pre_hooks)


__all__ = ["Adopter", "steps_any", "watch_optimizers", "watching"]
