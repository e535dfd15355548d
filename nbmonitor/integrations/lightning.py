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
"""

from __future__ import annotations

from typing import Any, Unpack

from lightning.pytorch import Callback, LightningModule, Trainer

from nbmonitor.live.monitor import Monitor, attach
from nbmonitor.options import AttachOptions


class NbmonitorCallback(Callback):  # type: ignore[misc, unused-ignore]
    """Monitors a Lightning ``Trainer``'s training (extra ``lightning``); ``options`` are
    ``nbmonitor.attach``'s, with ``total_steps`` from ``trainer.max_steps`` (else
    ``trainer.estimated_stepping_batches`` when finite) and ``start_step=trainer.global_step``
    unless they say otherwise. The monitor of the latest ``fit()`` is ``callback.monitor``
    (closed at ``on_train_end`` or ``on_exception``)."""

    def __init__(self, **options: Unpack[AttachOptions]) -> None:
        self.options = options
        self.monitor: Monitor | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        optimizers = trainer.optimizers
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
        options: dict[str, Any] = {
            "total_steps": int(total) if 0 < total < float("inf") else None,
            "start_step": trainer.global_step,
            **self.options,
        }
        self.monitor = attach(pl_module, optimizers[0] if len(optimizers) == 1 else None, **options)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.monitor is not None:
            self.monitor.close()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        if self.monitor is not None:
            self.monitor.close()


__all__ = ["NbmonitorCallback"]
