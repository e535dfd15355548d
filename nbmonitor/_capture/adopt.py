"""``attach(model)`` without an optimizer: the first optimizer that steps one of the model's
parameters becomes the monitor's (an optimizer created after attach, as the Hugging Face
Trainer builds its own inside ``train()``), found by one of torch's global optimizer step
pre-hooks. From that step on, steps are that optimizer's steps, the first including the
backward passes the clock held for it (``clock._Held``); before it, backward passes.

The global hook holds the step clock weakly (a dropped model still goes) and is removed with
the clock's other hooks at close, on the thread that attached. A monitor released from
another thread (its model was collected) leaves it inert and it is removed at the next
attach: torch may be iterating the global hooks in an optimizer step on the training thread
right then, and removing one under it would raise there. Optimizers of other parameters are
remembered (weakly) and not looked at again.
"""

from __future__ import annotations

import threading
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


# Global hooks of monitors released from another thread, inert, to remove on an attaching one.
_DEFERRED: list[RemovableHandle] = []


class GlobalHookHandle:
    """Removes the global hook at once on the thread that attached; from another thread it
    is deferred to the next ``purge()`` (see the module docstring)."""

    def __init__(self, handle: RemovableHandle) -> None:
        self._handle = handle
        self._thread = threading.get_ident()

    def remove(self) -> None:
        if threading.get_ident() == self._thread:
            self._handle.remove()
            purge()
        else:
            _DEFERRED.append(self._handle)


def purge() -> None:
    """Remove the global hooks left inert by monitors released from other threads (called
    on the thread that attaches)."""
    while _DEFERRED:
        _DEFERRED.pop().remove()


def watch_optimizers(clock: Adopter) -> list[GlobalHookHandle]:
    """Offer ``clock.adopt`` each optimizer that steps until it adopts one."""
    purge()
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

    return [GlobalHookHandle(register_optimizer_step_pre_hook(pre))]


def watching() -> int:
    """How many global optimizer pre-step hooks are registered (tests: none left behind)."""
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    return len(_global_optimizer_pre_hooks)


__all__ = ["Adopter", "GlobalHookHandle", "purge", "steps_any", "watch_optimizers", "watching"]
