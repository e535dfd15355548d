"""Activation statistics of leaf modules every ``every`` steps, and more often early in the run
(``base.due``) (``activations=True``): mean,
std, max |x| and the fraction of exact zeros of each output, on the device, handed over as one
record by the root's forward; the sampler reports dead units from them."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nbmonitor._capture.device_value import DeviceValue
from nbmonitor._capture.inputs import first_tensor
from nbmonitor._capture.probes.base import ProbeBase, StepContext, due
from nbmonitor.errors import Guard
from nbmonitor.records import AuxRecord


class ActivationsProbe(ProbeBase):
    name = "activations"

    def __init__(self, guard: Guard, model: torch.nn.Module, every: int) -> None:
        super().__init__(guard)
        self.every = every or 1
        self._leaf_names = {
            m: n for n, m in model.named_modules() if not any(True for _ in m.children())
        }
        self._on = False
        self._rows: list[torch.Tensor] = []
        self._row_names: list[str] = []

    def events(self) -> tuple[str, ...]:
        return ("forward_pre", "forward")

    def install(self, model: torch.nn.Module) -> list[RemovableHandle]:
        return [m.register_forward_hook(self._stats) for m in self._leaf_names]

    def forward_pre(self, ctx: StepContext) -> None:
        # The first micro-batch of a sampled step opens sampling (1-based steps).
        self._on = due(ctx.step + 1, self.every)

    def _stats(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self._on or not self.guard.on or not torch.is_grad_enabled():
            return None
        try:
            out = first_tensor(output)
            if out is None or not out.is_floating_point() or not out.numel():
                return None
            x = out.detach().to(torch.float32)
            std = x.std() if x.numel() > 1 else x.mean() * 0
            row = torch.stack([x.mean(), std, x.abs().max(), (x == 0).to(torch.float32).mean()])
            self._rows.append(row)
            self._row_names.append(self._leaf_names[module])
        except Exception as exc:
            self.guard.failed(exc)
        return None

    def forward(self, ctx: StepContext, output: Any) -> None:
        if not self._rows:
            return
        rows, names = self._rows, tuple(self._row_names)
        self._rows, self._row_names = [], []
        self._on = False
        packed = torch.stack([r.to(rows[0].device) for r in rows])
        ctx.recorder.put(
            AuxRecord(ctx.log_step, "activations", names, DeviceValue(packed.reshape(-1)))
        )
