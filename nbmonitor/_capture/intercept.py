"""The torch calls the step clock watches while a monitor is attached, besides its hooks.

- ``torch.nn.utils.clip_grad_norm_``: ``grad_norm`` is what it returns, the norm *before*
  clipping. The optimizer's pre-step hook runs after the clip has scaled the gradients (a
  curve flat at ``max_norm``), so the per-parameter norms are taken as the clip starts, and its
  return value (a tensor; no sync) is recorded as the step's total.
- ``torch.amp.GradScaler.step``: when the scaler finds inf/NaN it skips ``optimizer.step()``,
  so no optimizer hook runs; a scaler step with no optimizer step inside is a skipped step.
- ``torch.autograd.backward`` (which ``Tensor.backward`` calls, as do ``accelerator.backward``,
  Lightning's closure and the HF Trainer): the tensors a backward pass starts from are the
  step's loss when the loop logs none (``backward_loss.py``).
- ``torch.amp.GradScaler.scale``: what it was given, so that a backward through its result is
  read as the loss before scaling.

Both are replaced by wrappers on the module/class while at least one listener is attached
and put back when the last one leaves (unless someone replaced them since: then theirs stays
and ours passes through). The wrappers call the listeners, which never raise (each is behind
the clock's Guard), except ``NonFiniteError`` (``on_nan="raise"``).

Code that bound the function before attach (``from torch.nn.utils import clip_grad_norm_``
at import time) calls the original: then ``grad_norm`` is measured at the optimizer step as
before, after clipping (docs/guide.md).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
import torch.nn.utils.clip_grad as _clip_module


class Listener(Protocol):
    def clip_started(self, params: list[torch.Tensor]) -> None: ...

    def clip_done(self, params: list[torch.Tensor], total: torch.Tensor, max_norm: object) -> None:
        """After the clip; ``total`` is what it returned."""

    def scaler_step_started(self, optimizer: object) -> None: ...

    def scaler_step_done(self, optimizer: object) -> None: ...

    def loss_scaled(self, scaled: torch.Tensor, loss: torch.Tensor) -> None:
        """``GradScaler.scale(loss)`` returned ``scaled``."""

    def backward_called(self, tensors: object, grad_tensors: object, keeps_graph: bool) -> None:
        """``torch.autograd.backward`` is about to run from ``tensors``; ``keeps_graph``: it
        was asked to keep the graph (``retain_graph`` or ``create_graph``)."""

    def backward_failed(self) -> None:
        """The backward that ``backward_called`` announced raised (out of memory, an
        interrupt): its graph was not freed."""


_lock = threading.Lock()
# Held weakly: a monitor whose model is dropped goes away with it (its step clock holds the
# model), and then stops listening by itself.
_listeners: tuple[weakref.ref[Listener], ...] = ()


def _live() -> list[Listener]:
    return [listener for ref in _listeners if (listener := ref()) is not None]


_ORIGINAL_CLIP = _clip_module.clip_grad_norm_
_ORIGINAL_SCALER_STEP = torch.amp.GradScaler.step
_ORIGINAL_SCALER_SCALE = torch.amp.GradScaler.scale
_ORIGINAL_BACKWARD = torch.autograd.backward


@functools.wraps(_ORIGINAL_CLIP)
def clip_grad_norm_(
    parameters: torch.Tensor | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    listeners = _live()
    if not listeners:
        return _ORIGINAL_CLIP(parameters, max_norm, norm_type, error_if_nonfinite, foreach)
    # A generator can be read once: the listeners and the clip get the same list.
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    with torch.no_grad():
        for listener in listeners:
            listener.clip_started(params)
    total = _ORIGINAL_CLIP(params, max_norm, norm_type, error_if_nonfinite, foreach)
    for listener in listeners:
        listener.clip_done(params, total, max_norm)
    return total


@functools.wraps(_ORIGINAL_SCALER_STEP)
def scaler_step(self: torch.amp.GradScaler, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
    listeners = _live()
    for listener in listeners:
        listener.scaler_step_started(optimizer)
    result = _ORIGINAL_SCALER_STEP(self, optimizer, *args, **kwargs)
    for listener in listeners:
        listener.scaler_step_done(optimizer)
    return result


@functools.wraps(_ORIGINAL_SCALER_SCALE)
def scaler_scale(self: torch.amp.GradScaler, outputs: Any) -> Any:
    result = _ORIGINAL_SCALER_SCALE(self, outputs)
    if isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor):
        for listener in _live():
            listener.loss_scaled(result, outputs)
    return result


@functools.wraps(_ORIGINAL_BACKWARD)
def backward(tensors: Any, grad_tensors: Any = None, *args: Any, **kwargs: Any) -> None:
    # The rest is passed on as it came: a torch that adds, drops or reorders a parameter
    # after these two is still called as the loop called it. retain_graph and create_graph
    # are torch's next two (positional or by name). A loop over the weak references, not
    # _live(): no list made at each backward.
    if args[1:]:  # Tensor.backward passes both positionally
        keeps_graph = bool(args[0] or args[1])
    else:
        retain = args[0] if args else kwargs.get("retain_graph")
        keeps_graph = bool(retain or kwargs.get("create_graph"))
    listeners = _listeners
    for ref in listeners:
        listener = ref()
        if listener is not None:
            listener.backward_called(tensors, grad_tensors, keeps_graph)
    try:
        return _ORIGINAL_BACKWARD(tensors, grad_tensors, *args, **kwargs)
    except BaseException:
        for ref in listeners:
            listener = ref()
            if listener is not None:
                listener.backward_failed()
        raise


# Where the function is looked up: torch.nn.utils.clip_grad_norm_ and its home module.
_CLIP_HOMES: tuple[Any, ...] = (torch.nn.utils, _clip_module)


def _install() -> None:
    for home in _CLIP_HOMES:
        if home.clip_grad_norm_ is _ORIGINAL_CLIP:
            home.clip_grad_norm_ = clip_grad_norm_
    if torch.amp.GradScaler.step is _ORIGINAL_SCALER_STEP:
        torch.amp.GradScaler.step = scaler_step  # type: ignore[method-assign]
    if torch.amp.GradScaler.scale is _ORIGINAL_SCALER_SCALE:
        torch.amp.GradScaler.scale = scaler_scale  # type: ignore[method-assign]
    # Tensor.backward looks torch.autograd.backward up at each call.
    if torch.autograd.backward is _ORIGINAL_BACKWARD:
        torch.autograd.backward = backward


def _uninstall() -> None:
    for home in _CLIP_HOMES:
        if home.clip_grad_norm_ is clip_grad_norm_:
            home.clip_grad_norm_ = _ORIGINAL_CLIP
    if torch.amp.GradScaler.step is scaler_step:
        torch.amp.GradScaler.step = _ORIGINAL_SCALER_STEP  # type: ignore[method-assign]
    if torch.amp.GradScaler.scale is scaler_scale:
        torch.amp.GradScaler.scale = _ORIGINAL_SCALER_SCALE  # type: ignore[method-assign]
    if torch.autograd.backward is backward:
        torch.autograd.backward = _ORIGINAL_BACKWARD


def listen(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` around the watched torch calls until the returned function is called."""
    global _listeners

    def remove(ref: weakref.ref[Listener] | None = None) -> None:
        global _listeners
        with _lock:
            if held not in _listeners:
                return
            _listeners = tuple(x for x in _listeners if x is not held)
            if not _listeners:
                _uninstall()

    held = weakref.ref(listener, remove)
    with _lock:
        if not _listeners:
            _install()
        _listeners = (*_listeners, held)
    return remove


def listening() -> int:
    """How many listeners are attached (tests: none is left behind)."""
    return len(_listeners)


__all__ = [
    "Listener",
    "backward",
    "clip_grad_norm_",
    "listen",
    "listening",
    "scaler_scale",
    "scaler_step",
]
