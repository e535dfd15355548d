"""Which module first produced a NaN/Inf output (``check_forward=True``).

A forward hook on every module records a non-finite flag of its output and the mean, std and
max |x| of its input, on the device; the root's forward hands them over as one record. With
``on_nan="raise"`` the flags are read on the host at once (a sync by design) and the first
module with a non-finite output is named in a ``NonFiniteError``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nbmonitor._capture.device_value import DeviceValue
from nbmonitor._capture.inputs import first_tensor
from nbmonitor._capture.probes.base import ProbeBase, StepContext
from nbmonitor._capture.probes.grad_norms import STOP_MARK_FORWARD
from nbmonitor.errors import Guard, NonFiniteError
from nbmonitor.records import AuxRecord


class ForwardCheckProbe(ProbeBase):
    name = "check_forward"

    def __init__(self, guard: Guard, model: torch.nn.Module, raise_non_finite: bool) -> None:
        super().__init__(guard)
        # Weakly keyed: the modules' hooks hold this probe; the root among them must not be
        # held back (a cycle that outlives a dropped model until a full garbage collection).
        self._names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary(
            (m, n or "(root)") for n, m in model.named_modules()
        )
        self.raise_non_finite = raise_non_finite
        self._rows: list[torch.Tensor] = []
        self._row_names: list[str] = []

    def events(self) -> tuple[str, ...]:
        return ("forward",)

    def install(self, model: torch.nn.Module) -> list[RemovableHandle]:
        return [module.register_forward_hook(self._check_output) for module in self._names]

    def _check_output(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        guard = self.guard
        if not guard.on or not torch.is_grad_enabled():
            return None
        try:
            out = first_tensor(output)
            if out is None or not out.is_floating_point():
                return None
            flag = (~torch.isfinite(out.detach())).any().to(torch.float32).reshape(1)
            inp = first_tensor(args)
            if inp is not None and inp.is_floating_point() and inp.numel():
                x = inp.detach().to(torch.float32)
                stats = torch.stack(
                    [x.mean(), x.std() if x.numel() > 1 else x.mean() * 0, x.abs().max()]
                )
            else:
                stats = torch.full((3,), float("nan"), device=flag.device)
            self._rows.append(torch.cat([flag, stats.to(flag.device)]))
            self._row_names.append(self._names.get(module, type(module).__name__))
        except Exception as exc:
            guard.failed(exc)
        return None

    def forward(self, ctx: StepContext, output: Any) -> None:
        if not self._rows:
            return
        step = ctx.log_step
        rows, names = self._rows, tuple(self._row_names)
        self._rows, self._row_names = [], []
        packed = torch.stack([r.to(rows[0].device) for r in rows])
        if self.raise_non_finite:
            flags = packed[:, 0].cpu()  # opt-in: raise mode synchronises by design
            if bool(flags.any()):
                first = int(flags.nonzero()[0, 0])
                mean, std, maxabs = (float(v) for v in packed[first, 1:].cpu())
                # The stop is an event of the run: the sampler writes it to the run log.
                stopped = AuxRecord(step, "stopped", (names[first],), STOP_MARK_FORWARD)
                ctx.recorder.put(stopped)
                raise NonFiniteError(
                    f"nbmonitor: non-finite output first in module {names[first]!r} at step "
                    f"{step} (its input: mean {mean:.3g}, std {std:.3g}, max |x| {maxabs:.3g})."
                )
        ctx.recorder.put(AuxRecord(step, "forward", names, DeviceValue(packed.reshape(-1))))
