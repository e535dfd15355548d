"""The loss of a model whose output carries one (Hugging Face style ``output.loss``), for steps
in which neither ``mon.log(loss=...)`` nor a backward pass (``backward_loss.py``) gives one."""

from __future__ import annotations

from typing import Any

import torch

from nbmonitor._capture.inputs import output_loss
from nbmonitor._capture.probes.base import ProbeBase, StepContext
from nbmonitor._capture.recorder import make_log_record
from nbmonitor.errors import Guard
from nbmonitor.records import FROM_OUTPUT

# A model whose first this many grad-enabled forwards returned a plain tensor (most models)
# has no output loss: the probe retires, so that its steps make no call for it.
RETIRE_AFTER = 32


class OutputLossProbe(ProbeBase):
    name = "output_loss"

    def __init__(self, guard: Guard) -> None:
        super().__init__(guard)
        self._tensors = 0  # forwards that returned a tensor, in a row from the first

    def events(self) -> tuple[str, ...]:
        return ("forward",)

    def forward(self, ctx: StepContext, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            if self._tensors >= 0:
                self._tensors += 1
                if self._tensors >= RETIRE_AFTER:
                    ctx.retired.append(self)
            return
        self._tensors = -1  # an output of another kind: the probe stays
        loss = output_loss(output)
        if loss is not None:
            record = make_log_record(ctx.log_step, {"loss": loss})
            record.source = FROM_OUTPUT  # mon.log(loss=...) or a backward's root wins
            ctx.recorder.put(record)
