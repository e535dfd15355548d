"""What a training framework decides for the step clock, read from its own objects (duck-typed:
neither Lightning nor Accelerate is imported here).

- **The configured accumulation count.** Lightning's automatic optimization and
  ``accelerator.backward`` divide each micro-batch's loss by the *configured* count
  (``accumulate_grad_batches``, ``gradient_accumulation_steps``), also on a step with fewer
  micro-batches (an epoch's last): the roots of such a step's backward passes add up to less
  than the loss the framework reports (the mean of its micro-batches' losses).
  ``backward_loss.py`` scales them back with this count. Read when a step's roots are read, not
  at attach: a trainer attached later (a module attached before ``fit``) still counts.
- **A LightningModule attached without the callback.** Its ``training_step`` rarely calls the
  module itself (``self.body(x)``, a loss helper), so the module's forward hooks see no batch:
  no samples, and a value logged in ``training_step`` would belong to the step that just
  ended. Its ``training_step`` is wrapped (on the instance, put back at close) to start each
  micro-batch there, as the callback's ``on_train_batch_start`` does.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch


def _lightning_module(model: object) -> bool:
    return any(
        cls.__name__ == "LightningModule"
        and cls.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
        for cls in type(model).__mro__
    )


def accumulation(model: torch.nn.Module, optimizer: object) -> Callable[[], int] | None:
    """A reader of the micro-batch count the framework divides each loss by, or None when no
    framework divides (a plain loop: its own division is its business). ``optimizer`` is the
    one given to ``attach``, before a wrapper is taken off."""
    state = getattr(optimizer, "gradient_state", None)
    if state is not None and hasattr(state, "num_steps"):  # Accelerate's AcceleratedOptimizer

        def accelerate() -> int:
            return int(state.num_steps)

        return accelerate
    if _lightning_module(model):

        def lightning() -> int:
            if not getattr(model, "automatic_optimization", True):
                return 1  # manual_backward divides nothing
            trainer = model.__dict__.get("_trainer")  # the property raises when detached
            count = getattr(trainer, "accumulate_grad_batches", 1)
            return count if isinstance(count, int) else 1

        return lightning
    return None


class TrainingStepBatches:
    """A LightningModule's ``training_step``, wrapped on the instance so that each call starts
    a micro-batch (``batch_started``, its first argument the batch); ``remove()`` puts it back
    (unless someone replaced it since). A handle like torch's ``RemovableHandle``. The model is
    held weakly, here and in the wrapper (the step clock holds this handle, and holds the model
    weakly: a dropped model must go with its monitor)."""

    def __init__(self, model: torch.nn.Module, batch_started: Callable[[object], None]) -> None:
        self._model = weakref.ref(model)
        own = model.__dict__.get("training_step")  # an instance's own: called as it is
        self._own = own
        function = type(model).training_step  # type: ignore[attr-defined]
        model_ref = self._model

        @functools.wraps(function)  # Lightning's is_overridden reads the user's code through it
        def training_step(*args: Any, **kwargs: Any) -> Any:
            batch_started(args[0] if args else kwargs.get("batch"))
            if own is not None:
                return own(*args, **kwargs)
            return function(model_ref(), *args, **kwargs)

        self._wrapper = training_step
        model.__dict__["training_step"] = training_step

    def remove(self) -> None:
        model = self._model()
        if model is None or model.__dict__.get("training_step") is not self._wrapper:
            return  # gone, or replaced since: theirs stays
        if self._own is not None:
            model.__dict__["training_step"] = self._own
        else:
            del model.__dict__["training_step"]


def watch_batches(
    model: torch.nn.Module, batch_started: Callable[[object], None]
) -> TrainingStepBatches | None:
    """The handle that starts a LightningModule's micro-batches in its ``training_step``; None
    for any other model (its forwards count its batches)."""
    if not _lightning_module(model) or not callable(getattr(model, "training_step", None)):
        return None
    return TrainingStepBatches(model, batch_started)
