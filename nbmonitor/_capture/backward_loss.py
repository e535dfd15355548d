"""The step's loss when the loop logs none: the value of the tensors its backward passes start
from (``torch.autograd.backward``, which ``Tensor.backward``, ``accelerator.backward``,
Lightning's closure and the HF Trainer all call; seen through ``intercept.py``), before a
GradScaler's scaling. One record per root; the sampler adds a step's up (each micro-batch's
share of the step's loss, ``_engine/assemble/steps.py``). ``mon.log(loss=...)`` comes first.

Most loops log the loss themselves, often after ``optimizer.step()``, so a root is only kept
(detached: no graph) until the step has ended and the loop has had its chance to log; it is
read (on an accelerator, one more device-to-host copy and event) only when the loop did not
log a loss for that step: at the next micro-batch, or at ``flush()``/``close()``.
"""

from __future__ import annotations

import collections
import weakref

import torch

from nbmonitor._capture.device_value import DeviceValue
from nbmonitor._capture.probes.base import StepContext
from nbmonitor.records import FROM_BACKWARD, LogRecord


class BackwardLoss:
    """Reads the roots of the backward passes of one step clock's steps."""

    __slots__ = ("_ctx", "_logged", "_pending", "_scaled")

    def __init__(self, ctx: StepContext) -> None:
        self._ctx = ctx
        # The last GradScaler.scale(loss): its result (weakly) and the loss, detached so that
        # no autograd graph is kept.
        self._scaled: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None
        # Roots not read yet: (step, detached root, its version when the backward started).
        # A deque: the training thread appends, and release() may run on a flushing thread.
        self._pending: collections.deque[tuple[int, torch.Tensor, int]] = collections.deque()
        self._logged = -1  # the last step mon.log(loss=...) gave a loss for

    @property
    def pending(self) -> bool:
        return bool(self._pending)

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
        step = self._ctx.log_step
        if step == self._logged:
            return  # the loop logged this step's loss already
        if self._pending and self._pending[0][0] != step:
            self.release(step - 1)  # an earlier step's, not released by a forward
        for value in values:
            # detach() is a view (no device work); the version tells an in-place change since.
            detached = value.detach()
            self._pending.append((step, detached, detached._version))  # noqa: SLF001  (torch's in-place counter)

    def logged(self, step: int) -> None:
        """``mon.log(loss=...)`` gave the loss of ``step``: its roots are not needed."""
        self._logged = step

    def release(self, through: int | None = None) -> None:
        """Record the roots of the steps up to ``through`` (all: None) the loop logged no loss
        for; drop those it did."""
        pending = self._pending
        recorder = self._ctx.recorder
        while pending:
            step = pending[0][0]
            if through is not None and step > through:
                return
            try:
                step, value, version = pending.popleft()
            except IndexError:  # emptied by another thread between the check and the pop
                return
            if step == self._logged or value._version != version:  # noqa: SLF001
                continue  # logged by the loop; or changed in place, its value then unknown
            record = LogRecord(step, source=FROM_BACKWARD)
            record.tensors.append((("loss",), DeviceValue(value)))
            recorder.put(record)
