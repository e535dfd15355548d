"""The step's loss when the loop logs none: the value of the tensors its backward passes start
from (``torch.autograd.backward``, which ``Tensor.backward``, ``accelerator.backward``,
Lightning's closure and the HF Trainer all call; seen through ``intercept.py``), before a
GradScaler's scaling. One record per root; the sampler adds a step's up (each micro-batch's
share of the step's loss, ``_engine/assemble/steps.py``). ``mon.log(loss=...)`` comes first.
"""

from __future__ import annotations

import weakref

import torch

from nbmonitor._capture.device_value import DeviceValue
from nbmonitor._capture.probes.base import StepContext
from nbmonitor.records import FROM_BACKWARD, LogRecord


class BackwardLoss:
    """Reads the roots of the backward passes of one step clock's steps."""

    __slots__ = ("_ctx", "_scaled")

    def __init__(self, ctx: StepContext) -> None:
        self._ctx = ctx
        # The last GradScaler.scale(loss): its result (weakly) and the loss, detached so that
        # no autograd graph is kept.
        self._scaled: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None

    def scaled(self, scaled: torch.Tensor, loss: torch.Tensor) -> None:
        """``GradScaler.scale(loss)`` returned ``scaled``."""
        if loss.numel() == 1:
            self._scaled = (weakref.ref(scaled), loss.detach())

    def started(self, tensors: object) -> None:
        """A backward pass starts from ``tensors`` (with no gradient given)."""
        roots = (tensors,) if isinstance(tensors, torch.Tensor) else tensors
        if not isinstance(roots, (tuple, list)):
            return
        scaled, self._scaled = self._scaled, None
        values = []
        for root in roots:
            if not isinstance(root, torch.Tensor) or root.numel() != 1:
                return  # not a loss (a non-scalar root needs a gradient)
            if root.is_meta or root.is_complex():
                return
            values.append(scaled[1] if scaled is not None and scaled[0]() is root else root)
        ctx = self._ctx
        step = ctx.log_step
        for value in values:
            record = LogRecord(step, source=FROM_BACKWARD)
            record.tensors.append((("loss",), DeviceValue(value)))
            ctx.recorder.put(record)
