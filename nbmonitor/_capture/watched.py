"""What the step clock does when ``intercept.py`` sees the loop call ``clip_grad_norm_`` or
``GradScaler.step`` (a mixin of ``StepClock``, kept apart to keep the clock's module small)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nbmonitor._capture.probes.base import NO_NORMS, StepContext
from nbmonitor.errors import Guard


class WatchedCalls:
    """The clip and GradScaler listeners; ``StepClock`` provides the state and the calls below."""

    ctx: StepContext
    optimizer: torch.optim.Optimizer | None
    _param_ids: frozenset[int]
    _in_scaler_step: bool
    _stepped: bool
    _at: dict[str, tuple[tuple[Guard, Callable[..., None]], ...]]

    def _guarded(self, hook: str, work: Callable[[], None]) -> None:
        raise NotImplementedError

    def _call(self, calls: tuple[tuple[Guard, Callable[..., None]], ...], *args: Any) -> None:
        raise NotImplementedError

    def _end_step(self, skipped: bool = False) -> None:
        raise NotImplementedError

    def clip_started(self, params: list[torch.Tensor]) -> None:
        # Another model's clip (or one of no parameters) is not this step's.
        if params and id(params[0]) in self._param_ids:
            self._guarded("clip", self._clip_start)

    def _clip_start(self) -> None:
        ctx = self.ctx
        ctx.clips += 1
        if ctx.clips == 1:
            self._call(self._at["clip"])

    def clip_done(self, params: list[torch.Tensor], total: torch.Tensor, max_norm: object) -> None:
        if params and id(params[0]) in self._param_ids:
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
