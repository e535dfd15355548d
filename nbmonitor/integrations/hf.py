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

Steering (docs/steering.md) acts at the Trainer's own step end (``on_step_end``: after the
optimizer and the scheduler stepped and ``global_step`` counted the step), not inside
``optimizer.step()``: a stop sets ``control.should_training_stop`` (the Trainer finishes as at
``max_steps``: ``train()`` returns, the run closes ``stopped``); a checkpoint sets
``control.should_save``, so the Trainer writes its own ``checkpoint-<step>`` folder (model,
optimizer, scheduler, RNG and trainer state: ``train(resume_from_checkpoint=...)`` resumes from
it); pause holds the training thread there; a learning rate applies to every param group and
scales the Trainer's scheduler's ``base_lrs`` by the same factor, so its schedule goes on from
the new level rather than putting the old rate back at the next step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Unpack

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from nbmonitor.live.monitor import Monitor, attach
from nbmonitor.options import AttachOptions


class NbmonitorCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Monitors a ``Trainer``'s training (extra ``hf``); ``options`` are ``nbmonitor.attach``'s,
    with ``total_steps=state.max_steps``, ``start_step=state.global_step`` and the Trainer's
    learning-rate scheduler as ``scheduler`` unless they say otherwise. The monitor of the
    latest ``train()`` is ``callback.monitor`` (closed when training ends); steer it with
    ``callback.monitor.stop()``, ``pause()``, ``checkpoint()``, ``set_lr()``, its dashboard or
    ``nbmonitor ctl``."""

    def __init__(self, **options: Unpack[AttachOptions]) -> None:
        self.options = options
        self.monitor: Monitor | None = None
        self._save = False  # a checkpoint was asked for at the step ending now
        self._output_dir = "."

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        self._save = False
        self._output_dir = str(args.output_dir)
        options: dict[str, Any] = {
            "total_steps": state.max_steps or None,
            "start_step": state.global_step,
            "on_checkpoint": self._checkpoint,
            **self.options,
        }
        # ReduceLROnPlateau (no base_lrs) lowers the rate from where it is: nothing to scale.
        if "scheduler" not in options and hasattr(lr_scheduler, "base_lrs"):
            options["scheduler"] = lr_scheduler
        self.monitor = attach(model, optimizer, **options)
        self.monitor.steering.use_framework()

    def _checkpoint(self, path: Path, step: int) -> str:
        # Called from on_step_end (the steering's boundary): the Trainer saves right after it.
        self._save = True
        return os.path.join(self._output_dir, f"checkpoint-{step}")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        mon = self.monitor
        if mon is None:
            return
        steering = mon.steering
        if steering.waiting:
            steering.at_boundary(state.global_step)
            if self._save:
                self._save = False
                control.should_save = True
            if steering.stop_requested:
                control.should_training_stop = True

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.monitor is not None:
            self.monitor.close()


__all__ = ["NbmonitorCallback"]
