"""Lightning: a ``Callback`` that attaches a monitor when training starts and closes it when
training ends (or stops on an exception).

    trainer = L.Trainer(..., callbacks=[NbmonitorCallback()])

It attaches to the ``LightningModule`` and to the trainer's torch optimizer (several optimizers:
the first that steps, see ``attach``), so steps are optimizer steps (``trainer.global_step``,
counted on from a resumed checkpoint's); validation (no gradients) is not counted. Lightning
runs forward and backward inside ``optimizer.step(closure)``: the gradient norms are taken when
the closure returns, or as ``gradient_clip_val``'s clip starts (after
``on_before_optimizer_step``), so ``grad_norm`` is the norm before clipping. Each training batch
counts as a micro-batch, its samples the leading dimension of its first tensor, whatever
``training_step`` calls; ``mon.log`` inside ``training_step`` belongs to the step in progress
(``attach`` on a LightningModule does this by itself, callback or not: see
``_capture/frameworks.py``). The loss is the mean of ``training_step``'s losses over the step,
as Lightning reports it, read by nbmonitor from the backward itself: Lightning divides each by
``accumulate_grad_batches`` for backward, so their sum is their mean, and a shorter step (an
epoch's last) is scaled back by the count it lacks; ``manual_backward`` alike.

Steering (docs/steering.md) acts at the end of the batch that stepped the optimizer
(``on_train_batch_end``: the optimizer and a ``"step"`` scheduler stepped, ``global_step``
counted the step), where Lightning's own ``ModelCheckpoint`` saves: a stop sets
``trainer.should_stop`` (``fit()`` ends as Lightning's early stopping ends it, validation
included; the run closes ``stopped``); a checkpoint is ``trainer.save_checkpoint`` to
``<run_dir>/checkpoints/step-<N>.ckpt`` (resume with ``fit(..., ckpt_path=...)``); pause holds
the training thread there; a learning rate applies to every param group and scales the one
scheduler's ``base_lrs`` (several: none is touched, and each puts its own rate back when it
next steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Unpack

from lightning.pytorch import Callback, LightningModule, Trainer

from nbmonitor.live.monitor import Monitor, attach
from nbmonitor.options import AttachOptions


class NbmonitorCallback(Callback):  # type: ignore[misc, unused-ignore]
    """Monitors a Lightning ``Trainer``'s training (extra ``lightning``); ``options`` are
    ``nbmonitor.attach``'s, with ``total_steps`` from ``trainer.max_steps`` (else
    ``trainer.estimated_stepping_batches`` when finite) and ``start_step=trainer.global_step``
    and the trainer's one learning-rate scheduler as ``scheduler`` unless they say otherwise.
    The monitor of the latest ``fit()`` is ``callback.monitor`` (closed at ``on_train_end`` or
    ``on_exception``); steer it with ``callback.monitor.stop()``, ``pause()``, ``checkpoint()``,
    ``set_lr()``, its dashboard or ``nbmonitor ctl``."""

    def __init__(self, **options: Unpack[AttachOptions]) -> None:
        self.options = options
        self.monitor: Monitor | None = None
        self._trainer: Trainer | None = None  # while fit() runs: the checkpoint's saver
        self._seen = 0  # the global_step at the last batch's end

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        optimizers = trainer.optimizers
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
        options: dict[str, Any] = {
            "total_steps": int(total) if 0 < total < float("inf") else None,
            "start_step": trainer.global_step,
            "on_checkpoint": self._checkpoint,
            **self.options,
        }
        configs = trainer.lr_scheduler_configs
        # ReduceLROnPlateau (no base_lrs) lowers the rate from where it is: nothing to scale.
        one = configs[0].scheduler if len(configs) == 1 else None
        if "scheduler" not in options and hasattr(one, "base_lrs"):
            options["scheduler"] = one
        self._trainer = trainer
        self._seen = trainer.global_step
        self.monitor = attach(pl_module, optimizers[0] if len(optimizers) == 1 else None, **options)
        self.monitor.steering.use_framework()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        mon = self.monitor
        step = trainer.global_step
        if mon is None or step == self._seen:
            return  # a micro-batch of a step still accumulating
        self._seen = step
        steering = mon.steering
        if steering.waiting:
            steering.at_boundary(step)
            if steering.stop_requested:
                trainer.should_stop = True

    def _checkpoint(self, path: Path, step: int) -> str:
        # Called from on_train_batch_end (the steering's boundary), where ModelCheckpoint saves.
        trainer, mon = self._trainer, self.monitor
        if trainer is None:
            raise RuntimeError("the trainer is not fitting")
        if mon is not None and path == mon.run_dir / "checkpoints" / f"step-{step}.pt":
            path = path.with_suffix(".ckpt")  # nbmonitor's default name: Lightning's suffix
        trainer.save_checkpoint(path)
        return str(path)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._trainer = None
        if self.monitor is not None:
            self.monitor.close()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self._trainer = None
        if self.monitor is not None:
            self.monitor.close()


__all__ = ["NbmonitorCallback"]
