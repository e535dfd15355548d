"""Hugging Face ``Trainer``: a ``TrainerCallback`` that attaches a monitor when training starts
and closes it when training ends.

    trainer = Trainer(model, args, ..., callbacks=[NbmonitorCallback(total_steps=None)])

It attaches to the Trainer's model and to the torch optimizer inside Accelerate's wrapper, so
steps are optimizer steps (``state.global_step``, counted on from a resumed checkpoint's), and
evaluation (no gradients) is not counted. ``grad_norm`` is what the Trainer's clip returned
(nbmonitor sees ``clip_grad_norm_``), ``lr`` the rate the step used, as the Trainer logs them.
The loss is the one the Trainer logs (``on_log``): under gradient accumulation the model's
``.loss`` per micro-batch is scaled by the whole batch's token count, the logged one is not.
With ``logging_steps`` > 1 the steps in between keep the mean of the model's ``.loss``.
"""

from __future__ import annotations

from typing import Any, Unpack

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from nbmonitor.live.monitor import Monitor, attach
from nbmonitor.options import AttachOptions


class NbmonitorCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Monitors a ``Trainer``'s training; ``options`` are ``nbmonitor.attach``'s. The monitor
    of the latest ``train()`` is ``callback.monitor`` (closed when training ends)."""

    def __init__(self, **options: Unpack[AttachOptions]) -> None:
        self.options = options
        self.monitor: Monitor | None = None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        options: dict[str, Any] = {
            "total_steps": state.max_steps or None,
            "start_step": state.global_step,
            **self.options,
        }
        self.monitor = attach(model, optimizer, **options)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        # After the step ended: the value belongs to it (Monitor.log) and replaces the mean of
        # the model's .loss for that step (one loss per step).
        mon = self.monitor
        if mon is not None and mon.status != "closed" and logs and "loss" in logs:
            mon.log(loss=logs["loss"])

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.monitor is not None:
            self.monitor.close()


__all__ = ["NbmonitorCallback"]
