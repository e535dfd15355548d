"""Parameter norms and update norms (||dw|| / ||w||) every ``layer_every`` steps, and early in
the run more often (``base.due``: every one of the first 30 steps, every 10th up to 100).

A copy of the optimizer's parameters is taken before ``optimizer.step()`` and subtracted from
them after it; the copy is the costly part, hence the sampling (docs/performance.md).
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

    def events(self) -> tuple[str, ...]:
        return ("pre_step", "post_step")

    def pre_step(self, ctx: StepContext) -> None:
        if not due(ctx.step + 1, self.every):
            return
        params = [p.detach() for p in self.params]
        if not params:
            return
        size = sum(p.numel() * p.element_size() for p in params)
        if size > self.copy_max_bytes:
            self.copy_skipped = True
            return
        norms = _foreach_norm(params, 2, dtype=norm_dtype(params))
        self._before_norms = torch.stack([n.to(norms[0].device) for n in norms])
        self._before = list(_foreach_mul(params, 1.0))

    def post_step(self, ctx: StepContext) -> None:
        before, norms = self._before, self._before_norms
        self._before = self._before_norms = None
        if before is None or norms is None:
            return
        params = [p.detach() for p in self.params]
        _foreach_sub_(before, params)  # before - after: the update, in place
        delta = _foreach_norm(before, 2, dtype=norm_dtype(before))
        packed = torch.cat([norms, torch.stack([d.to(norms.device) for d in delta])])
        ctx.recorder.put(AuxRecord(ctx.step + 1, "update", self.names, DeviceValue(packed)))
