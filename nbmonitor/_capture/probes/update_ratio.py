"""Parameter norms and update norms (||dw|| / ||w||) every ``layer_every`` steps, and early in
the run more often (``base.due``: every one of the first 8 steps, then 4 a doubling of the step
count up to 100).

A copy of the optimizer's parameters is taken before ``optimizer.step()`` and subtracted from them
after it; the copy is the costly part, hence the sampling (benchmarks/NOTES.md, "What the overhead
is made of"). Only the tensors that can move are copied: a frozen one (``requires_grad=False``, a
fine-tune's base held by ``AdamW(model.parameters())``) is not stepped, so its update is not
measured (NaN) and its bytes neither cost a copy nor count towards the copy's cap.
"""

from __future__ import annotations

import torch
from torch import _foreach_mul, _foreach_norm, _foreach_sub_

from nbmonitor._capture.device_value import DeviceValue
from nbmonitor._capture.probes.base import ProbeBase, StepContext, due
from nbmonitor._capture.probes.grad_norms import norm_dtype
from nbmonitor.errors import Guard
from nbmonitor.records import AuxRecord

# Above this size the copy is skipped (update ratio NaN) rather than risking out of memory.
UPDATE_COPY_MAX_BYTES = 2 * 2**30


class UpdateRatioProbe(ProbeBase):
    name = "update_ratio"
    sampled = True  # the clock calls it on sampled steps only

    def __init__(
        self, guard: Guard, params: list[torch.nn.Parameter], names: list[str], every: int
    ) -> None:
        super().__init__(guard)
        self.params = params
        self.names = tuple(names)
        self.every = every
        self.copy_max_bytes = UPDATE_COPY_MAX_BYTES
        self.copy_skipped = False
        self._before: list[torch.Tensor] | None = None
        self._before_norms: torch.Tensor | None = None
        # Indices of the tensors copied this step; None: all of them (nothing frozen).
        self._moving: list[int] | None = None
        self._unmeasured: torch.Tensor | None = None  # a NaN on the norms' device

    def events(self) -> tuple[str, ...]:
        return ("pre_step", "post_step")

    def pre_step(self, ctx: StepContext) -> None:
        if not due(ctx.step + 1, self.every):
            return
        params = [p.detach() for p in self.params]
        if not params:
            return
        moving: list[int] | None = [i for i, p in enumerate(self.params) if p.requires_grad]
        if moving is not None and len(moving) == len(params):
            moving = None  # nothing frozen: the usual case, copied whole
        copied = params if moving is None else [params[i] for i in moving]
        size = sum(p.numel() * p.element_size() for p in copied)
        if size > self.copy_max_bytes:
            self.copy_skipped = True
            return
        norms = _foreach_norm(params, 2, dtype=norm_dtype(params))
        self._before_norms = torch.stack([n.to(norms[0].device) for n in norms])
        self._moving = moving
        self._before = list(_foreach_mul(copied, 1.0)) if copied else []

    def post_step(self, ctx: StepContext) -> None:
        before, norms = self._before, self._before_norms
        self._before = self._before_norms = None
        if before is None or norms is None:
            return
        moving, self._moving = self._moving, None
        params = [p.detach() for p in self.params]
        if moving is not None:
            params = [params[i] for i in moving]
        deltas: list[torch.Tensor] = []
        if before:
            _foreach_sub_(before, params)  # before - after: the update, in place
            deltas = [
                d.to(norms.device) for d in _foreach_norm(before, 2, dtype=norm_dtype(before))
            ]
        if moving is not None:
            # Frozen tensors: not stepped, not measured (NaN), in the tracked order.
            if self._unmeasured is None or self._unmeasured.device != norms.device:
                self._unmeasured = torch.full(
                    (), float("nan"), dtype=norms.dtype, device=norms.device
                )
            measured = dict(zip(moving, deltas, strict=True))
            deltas = [measured.get(i, self._unmeasured) for i in range(len(self.params))]
        packed = torch.cat([norms, torch.stack(deltas)])
        ctx.recorder.put(AuxRecord(ctx.step + 1, "update", self.names, DeviceValue(packed)))
