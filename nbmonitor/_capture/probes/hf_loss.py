"""The loss of a model whose output carries one (Hugging Face style ``output.loss``), for steps
in which neither ``mon.log(loss=...)`` nor a backward pass (``backward_loss.py``) gives one."""

from __future__ import annotations

from typing import Any

import torch

from nbmonitor._capture.inputs import output_loss
from nbmonitor._capture.probes.base import ProbeBase, StepContext
from nbmonitor._capture.recorder import make_log_record
from nbmonitor.records import FROM_OUTPUT


class OutputLossProbe(ProbeBase):
    name = "output_loss"

    def events(self) -> tuple[str, ...]:
        return ("forward",)

    def forward(self, ctx: StepContext, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            return  # most models: no call more at each forward
        loss = output_loss(output)
        if loss is not None:
            record = make_log_record(ctx.log_step, {"loss": loss})
            record.source = FROM_OUTPUT  # mon.log(loss=...) or a backward's root wins
            ctx.recorder.put(record)
