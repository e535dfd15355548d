"""The end of a whole backward pass, seen from one tensor of it: a hook on the tensor's gradient
queues a callback that autograd runs once the pass has finished (as DDP's reducer does)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd.variable import Variable

from nbmonitor.errors import Guard

_autograd_engine = vars(Variable)["_execution_engine"]


class BackwardEnd:
    """Calls ``at_end`` once at the end of each backward pass through a watched tensor."""

    def __init__(self, at_end: Callable[[], None], guard: Guard) -> None:
        self._at_end = at_end
        self._guard = guard
        self._queued = False

    def watch(self, tensor: torch.Tensor | None) -> None:
        if tensor is not None and tensor.requires_grad:
            tensor.register_hook(self._grad)  # type: ignore[no-untyped-call]

    def _grad(self, grad: torch.Tensor) -> None:
        try:
            if not self._queued:
                self._queued = True
                _autograd_engine.queue_callback(self._ended)
        except Exception as exc:
            self._guard.failed(exc)
        return None

    def _ended(self) -> None:
        self._queued = False
        self._at_end()
