"""What the step clock does when ``intercept.py`` sees the loop call ``clip_grad_norm_``,
``GradScaler.step``, ``GradScaler.scale`` or ``torch.autograd.backward`` (a mixin of
``StepClock``, kept apart to keep the clock's module small)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from nbmonitor._capture.device_value import DeviceValue
from nbmonitor._capture.probes.base import NO_NORMS, StepContext
from nbmonitor.errors import Guard
from nbmonitor.records import FROM_BACKWARD, LogRecord


class WatchedCalls:
    """The clip and GradScaler listeners; ``StepClock`` provides the state and the calls below."""

    ctx: StepContext
    optimizer: torch.optim.Optimizer | None
    _param_ids: frozenset[int]
    _in_scaler_step: bool
    _stepped: bool
    _at: dict[str, tuple[tuple[Guard, Callable[..., None]], ...]]
    # The last GradScaler.scale(loss): its result (weakly) and the loss, detached (no graph kept).
    _scaled: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None

    def _guarded(self, hook: str, work: Callable[[], None]) -> None:
        raise NotImplementedError

    def _call(self, calls: tuple[tuple[Guard, Callable[..., None]], ...], *args: Any) -> None:
        raise NotImplementedError

    def _end_step(self, skipped: bool = False) -> None:
        raise NotImplementedError

    def clip_started(self, params: list[torch.Tensor]) -> None:
        # Another model's clip (or one of no parameters) is not this step's; without an
        # optimizer a step ends with its backward, before any clip.
        if params and id(params[0]) in self._param_ids and self.optimizer is not None:
            self._guarded("clip", self._clip_start)

    def _clip_start(self) -> None:
        ctx = self.ctx
        ctx.clips += 1
        if ctx.clips == 1:
            self._call(self._at["clip"])

    def clip_done(self, params: list[torch.Tensor], total: torch.Tensor, max_norm: object) -> None:
        if params and id(params[0]) in self._param_ids and self.optimizer is not None:
            self._guarded("clip", lambda: self.ctx.clip_ended(total, max_norm))

    def scaler_step_started(self, optimizer: object) -> None:
        if optimizer is self.optimizer:
            self._in_scaler_step = True
            self._stepped = False

    def scaler_step_done(self, optimizer: object) -> None:
        if optimizer is not self.optimizer or not self._in_scaler_step:
            return
        self._in_scaler_step = False
        if not self._stepped:
            self._guarded("scaler_step", self._end_skipped_step)

    def _end_skipped_step(self) -> None:
        # inf/NaN, no step: it counts (as loops and HF's global_step do), marked skipped, without
        # norms of gradients not used.
        self.ctx.norms = NO_NORMS
        self._end_step(skipped=True)

    def loss_scaled(self, scaled: torch.Tensor, loss: torch.Tensor) -> None:
        if self.ctx.micro and loss.numel() == 1:
            self._guarded("loss", lambda: self._remember_scaled(scaled, loss))

    def _remember_scaled(self, scaled: torch.Tensor, loss: torch.Tensor) -> None:
        self._scaled = (weakref.ref(scaled), loss.detach())

    def backward_called(self, tensors: object, grad_tensors: object) -> None:
        # Only while this model's step is under way (a forward or an adapter's batch since the
        # last step ended): a backward of something else, between steps, is not its loss.
        if self.ctx.micro and grad_tensors is None:
            self._guarded("loss", lambda: self._record_roots(tensors))

    def _record_roots(self, tensors: object) -> None:
        """The step's loss when the loop logs none: the value of the tensors a backward starts
        from (scalars only, as ``backward()`` without a gradient takes), before a GradScaler's
        scaling; the sampler adds the step's micro-batches (``assemble/steps.py``)."""
        roots = (tensors,) if isinstance(tensors, torch.Tensor) else tensors
        if not isinstance(roots, (tuple, list)):
            return
        scaled = self._scaled
        self._scaled = None
        values = []
        for root in roots:
            if not isinstance(root, torch.Tensor) or root.numel() != 1 or root.is_meta:
                return  # not a loss (a non-scalar root needs a gradient)
            if root.is_complex():
                return
            values.append(scaled[1] if scaled is not None and scaled[0]() is root else root)
        step = self.ctx.log_step
        for value in values:  # one record each: the sampler adds them up
            record = LogRecord(step, source=FROM_BACKWARD)
            record.tensors.append((("loss",), DeviceValue(value)))
            self.ctx.recorder.put(record)
