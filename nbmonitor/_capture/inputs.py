"""What the capture side reads from the user's objects: an optimizer's parameters and learning
rates, a forward call's batch size and token count, the first tensor of an output, a Hugging
Face style output's loss."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

import torch

from nbmonitor._capture.device_value import DeviceValue


def optimizer_parameters(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """The optimizer's parameters in group order, each once."""
    seen: set[int] = set()
    out: list[torch.nn.Parameter] = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def learning_rates(optimizer: torch.optim.Optimizer | None) -> tuple[float | DeviceValue, ...]:
    """Each parameter group's learning rate (a tensor one stays on its device)."""
    if optimizer is None:
        return ()
    out: list[float | DeviceValue] = []
    for group in optimizer.param_groups:
        lr = group.get("lr", float("nan"))
        out.append(DeviceValue(lr) if isinstance(lr, torch.Tensor) else float(lr))
    return tuple(out)


def groups_added(
    optimizer: torch.optim.Optimizer | None, seen: int, known: frozenset[int]
) -> tuple[tuple[int, int, int], ...]:
    """The param groups after the first ``seen``: (index, parameters in it, of which not in
    ``known``, the ids of the attached model's parameters). One ``len()`` when none."""
    if optimizer is None or len(optimizer.param_groups) == seen:
        return ()
    return tuple(
        (i, len(g["params"]), sum(id(p) not in known for p in g["params"]))
        for i, g in enumerate(optimizer.param_groups[seen:], start=seen)
    )


def nested_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether an outer ``optimizer.step()`` of the same optimizer is still running: torch
    patches each Optimizer class's ``step`` to run the step hooks, so a subclass whose step
    calls ``super().step()`` runs them twice for one step. Walks the stack (only then)."""
    frame = inspect.currentframe()
    outer = 0
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wrapper" and code.co_filename.endswith(_OPTIMIZER_FILE):
            args = frame.f_locals.get("args")
            if isinstance(args, tuple) and args and args[0] is optimizer:
                outer += 1
                if outer > 1:
                    return True
        frame = frame.f_back
    return False


def batch_size(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """Leading dimension of the first tensor among a forward call's inputs (0 if none)."""
    for value in (*args, *kwargs.values()):
        found = first_tensor(value)
        if found is not None:
            return int(found.shape[0]) if found.dim() > 0 else 1
    return 0


def forward_counts(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int]:
    """``(batch_size(args, kwargs), token_count(args, kwargs))``, read at every forward: a
    first argument that is a tensor (most loops) in a few calls, the rest as those two do."""
    if args and not kwargs:
        first = args[0]
        if isinstance(first, torch.Tensor):
            shape = first.shape
            if not shape:
                return 1, 0
            if len(shape) == 2 and first.dtype in TOKEN_DTYPES:
                return shape[0], shape[0] * shape[1]
            return shape[0], 0
    return batch_size(args, kwargs), token_count(args, kwargs)


def token_count(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """Token ids a forward call was given (0 if none): the ``input_ids`` keyword, else a 2-D
    integer tensor as the first argument (batch x sequence). The number of elements, padding
    included, read from the shape alone: no device value is read."""
    ids = kwargs.get("input_ids") if kwargs else None
    if ids is None and args:
        ids = args[0]
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            return 0
    if isinstance(ids, torch.Tensor) and ids.dtype in TOKEN_DTYPES:
        return ids.numel()
    return 0


_OPTIMIZER_FILE = os.path.join("torch", "optim", "optimizer.py")
TOKEN_DTYPES = frozenset({torch.int64, torch.int32})


def batch_tokens(batch: object) -> int:
    """Token ids in a batch as a framework hands it over (``Monitor.batch_started``): a mapping
    with ``input_ids``, a 2-D integer tensor, or a tuple/list that starts with one."""
    if isinstance(batch, Mapping):
        return token_count((), batch)
    if isinstance(batch, (tuple, list)):
        return token_count((batch[0],), {}) if batch else 0
    return token_count((batch,), {})


def first_tensor(value: object, depth: int = 0) -> torch.Tensor | None:
    """The first tensor in ``value``, looking two levels into mappings, lists and tuples."""
    if isinstance(value, torch.Tensor):
        return value
    if depth >= 2:
        return None
    items: Any
    if isinstance(value, Mapping):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return None
    for item in items:
        found = first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def output_loss(output: object) -> torch.Tensor | None:
    """The ``.loss`` (or ``["loss"]``) of a Hugging Face style model output, if it is a scalar."""
    if isinstance(output, torch.Tensor):
        return None
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    return None
