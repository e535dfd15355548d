"""Data wait: the time from the end of one optimizer step to the first forward of the next.

That is the wait for the next batch plus whatever the loop does between steps. Recorded as
``data_wait_s`` for ranks of a distributed job, where it names stragglers: ranks that
synchronise every step (DDP's gradient all-reduce) all take as long as the slowest one, so
their step times agree, but the rank that comes late to the all-reduce is the one that waited
longest here (``health/rules/stragglers.py``). Two clock reads per step; no device work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nbmonitor._capture.probes.base import ProbeBase, StepContext
from nbmonitor.errors import Guard
from nbmonitor.records import LogRecord

KEY = "data_wait_s"


class DataWaitProbe(ProbeBase):
    name = "data_wait"

    def __init__(self, guard: Guard, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(guard)
        self._clock = clock
        self._first: float | None = None  # first grad-enabled forward of the step in progress
        self._last_end: float | None = None

    def events(self) -> tuple[str, ...]:
        return ("post_step",)

    def install(self, model: torch.nn.Module) -> list[RemovableHandle]:
        return [model.register_forward_pre_hook(self._forward_pre)]

    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._first is None and self.guard.on and torch.is_grad_enabled():
            self._first = self._clock()

    def post_step(self, ctx: StepContext) -> None:
        # The step ending now is ctx.step + 1 (the clock counts it after its probes).
        first, last = self._first, self._last_end
        if first is not None and last is not None:
            ctx.recorder.put(LogRecord(ctx.step + 1, {KEY: max(0.0, first - last)}))
        self._first = None
        self._last_end = self._clock()
