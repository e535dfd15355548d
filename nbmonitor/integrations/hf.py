"""Hugging Face ``Trainer``: a ``TrainerCallback`` that attaches a monitor when training starts
and closes it when training ends.

    trainer = Trainer(model, args, ..., callbacks=[NbmonitorCallback(total_steps=None)])

It attaches to the Trainer's model and to the torch optimizer inside Accelerate's wrapper, so
steps are optimizer steps (``state.global_step``, counted on from a resumed checkpoint's), and
evaluation (no gradients) is not counted. ``grad_norm`` is what the Trainer's clip returned
(nbmonitor sees ``clip_grad_norm_``), ``lr`` the rate the step used, as the Trainer logs them.
The loss of every step is what the Trainer logs at ``logging_steps=1``: the sum of the losses
its ``training_step`` passed to backward (each micro-batch's share: divided by the accumulation
count, or normalised by ``num_items_in_batch``), which nbmonitor reads from the backward passes
themselves. The averages over ``logging_steps`` the Trainer logs are not mixed in.
"""

from __future__ import annotations

from typing import Any, Unpack

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from nbmonitor.live.monitor import Monitor, attach
from nbmonitor.options import AttachOptions


class NbmonitorCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Monitors a ``Trainer``'s training (extra ``hf``); ``options`` are ``nbmonitor.attach``'s,
    with ``total_steps=state.max_steps`` and ``start_step=state.global_step`` unless they say
    otherwise. The monitor of the latest ``train()`` is ``callback.monitor`` (closed when
    training ends)."""

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

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.monitor is not None:
            self.monitor.close()


__all__ = ["NbmonitorCallback"]
