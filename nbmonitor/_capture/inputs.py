"""What the capture side reads from the user's objects: an optimizer's parameters, a forward
call's batch size and token count, the first tensor of an output, a Hugging Face style output's
loss."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


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


def batch_size(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """Leading dimension of the first tensor among a forward call's inputs (0 if none)."""
    for value in (*args, *kwargs.values()):
        found = first_tensor(value)
        if found is not None:
            return int(found.shape[0]) if found.dim() > 0 else 1
    return 0


def token_count(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """Token ids a forward call was given (0 if none): the ``input_ids`` keyword, else a 2-D
    integer tensor as the first argument (batch x sequence). The number of elements, padding
    included, read from the shape alone: no device value is read."""
    ids = kwargs.get("input_ids") if kwargs else None
    if ids is None and args:
        ids = args[0]
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            return 0
    if isinstance(ids, torch.Tensor) and ids.dtype in _TOKEN_DTYPES:
        return ids.numel()
    return 0


_TOKEN_DTYPES = frozenset({torch.int64, torch.int32})


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
