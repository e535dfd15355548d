"""What holds memory, on sampled steps (the first two, then every ``layer_every``: thinner early
on than the layer probes, ``base.due_thin``, as the breakdown changes little from one early
step to the next): the bytes of
the parameters, buffers, gradients and optimizer state (``memory_breakdown.held``) at the end
of the step, and the activations autograd saved for backward during the step's first
micro-batch, by top-level module, through ``torch.autograd.graph.saved_tensors_hooks``.

Sizes come from tensor metadata (storage sizes and addresses), never from values: no sync.
The saved-tensor hooks (and the module hooks that tell whose a saved tensor is) are put in
place only for a sampled forward (at the clock's ``forward_pre``) and taken out by a root
forward hook that runs even when the forward raises; the pack hook returns the
tensor itself and keeps only numbers, so nothing outlives the step.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nbmonitor._capture.memory_breakdown import Tally, held, parameter_storages
from nbmonitor._capture.probes.base import ProbeBase, StepContext, due_thin
from nbmonitor.errors import Guard
from nbmonitor.memory import ROOT, MemoryBreakdown, MemoryRow
from nbmonitor.records import MemoryRecord


class MemoryProbe(ProbeBase):
    name = "memory"
    sampled = True  # the clock calls it on sampled steps only

    def __init__(
        self,
        guard: Guard,
        model: torch.nn.Module,
        every: int,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(guard)
        self.every = every or 1
        self._wall_clock = wall_clock
        # Weakly: the model's hooks hold this probe, and a collected model closes its run.
        self._model = weakref.ref(model)
        self._optimizer: Callable[[], torch.optim.Optimizer | None] = lambda: None
        self._children = [(name, child) for name, child in model.named_children()]
        # The saved-tensor sampling of the step in progress.
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._handles: list[RemovableHandle] = []
        self._stack: list[str] = []
        self._saved: Tally | None = None
        self._pack_failed: Exception | None = None
        # The newest sampled activations (rows, step), for mon.memory().
        self.activations: tuple[MemoryRow, ...] = ()
        self.activations_step: int | None = None
        self.latest: MemoryBreakdown | None = None

    def bind(self, optimizer: Callable[[], torch.optim.Optimizer | None]) -> None:
        """Where the optimizer comes from (the clock's: it may be adopted later)."""
        self._optimizer = optimizer

    def events(self) -> tuple[str, ...]:
        return ("forward_pre", "pre_step", "post_step")

    # -- saved tensors -------------------------------------------------------------------------

    def forward_pre(self, ctx: StepContext) -> None:
        # The first micro-batch of a sampled step (the clock calls this once per step).
        if self._hooks is not None or not due_thin(ctx.step + 1, self.every):
            return
        model = self._model()
        if model is None:
            return
        self._saved = Tally(parameter_storages(model))
        self._stack = []
        # Hooks only for this forward (nothing on the other steps); the root's pops the
        # saved-tensor hooks even when the forward raises. All in place before the push, so
        # that a failure here leaves nothing pushed.
        handles = self._handles
        try:
            handles.append(model.register_forward_hook(self._root_done, always_call=True))
            for name, child in self._children:
                handles.append(child.register_forward_pre_hook(self._enter(name)))
                handles.append(child.register_forward_hook(self._leave, always_call=True))
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            hooks.__enter__()
        except BaseException:
            self._remove_handles()
            self._saved = None
            raise
        self._hooks = hooks

    def _enter(self, name: str) -> Callable[..., None]:
        def enter(module: torch.nn.Module, args: Any) -> None:
            self._stack.append(name)

        return enter

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # Inside the user's forward: it must never raise, and it keeps no reference.
        saved = self._saved
        if saved is not None:
            try:
                saved.add("activations", self._stack[-1] if self._stack else ROOT, t)
            except Exception as exc:
                self._pack_failed = exc
        return t

    def _root_done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        hooks = self._hooks
        if hooks is None:
            self._remove_handles()
            return
        self._hooks = None
        try:
            hooks.__exit__(None, None, None)
            self._remove_handles()
        except Exception as exc:  # never into the user's forward
            self.guard.failed(exc)

    def _remove_handles(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stack = []

    # -- the breakdown at the step's end -------------------------------------------------------

    def pre_step(self, ctx: StepContext) -> None:
        if self._optimizer() is None:  # a step without an optimizer ends with its backward
            self._record(ctx)

    def post_step(self, ctx: StepContext) -> None:
        self._record(ctx)

    def _record(self, ctx: StepContext) -> None:
        step = ctx.step + 1  # the step ending now
        saved, self._saved = self._saved, None
        if saved is None and not due_thin(step, self.every):
            return
        if self._pack_failed is not None:
            exc, self._pack_failed = self._pack_failed, None
            self.guard.failed(exc)
        if saved is not None:
            self.activations = tuple(saved.memory_rows())
            self.activations_step = step
        self.latest = self.now(step)
        ctx.recorder.put(MemoryRecord(self.latest))

    def now(self, step: int) -> MemoryBreakdown:
        """The breakdown as the tensors stand now, with the newest sampled activations."""
        rows, _ = held(self._model(), self._optimizer())
        return MemoryBreakdown(
            (*rows, *self.activations),
            step=step,
            time=self._wall_clock(),
            activations_step=self.activations_step,
        )


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
