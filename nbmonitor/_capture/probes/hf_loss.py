"""The loss of a model whose output carries one (Hugging Face style ``output.loss``), for steps
in which ``mon.log(loss=...)`` gives none."""

from __future__ import annotations

from typing import Any

from nbmonitor._capture.inputs import output_loss
from nbmonitor._capture.probes.base import ProbeBase, StepContext
from nbmonitor._capture.recorder import make_log_record


class OutputLossProbe(ProbeBase):
    name = "output_loss"

    def events(self) -> tuple[str, ...]:
        return ("forward",)

    def forward(self, ctx: StepContext, output: Any) -> None:
        loss = output_loss(output)
        if loss is not None:
            record = make_log_record(ctx.log_step, {"loss": loss})
            record.implicit = True  # mon.log(loss=...) in the same step wins
            ctx.recorder.put(record)
