"""The bytes a model and its optimizer hold, read from the tensors themselves (their storages'
sizes: metadata only, never a value, so never a device sync).

Each storage counts once, under the first category and module that holds it: a tied weight
(an embedding shared with the output layer) is one parameter, and a parameter that autograd
saves for backward is a parameter, not an activation. The rows are ``nbmonitor.memory``'s.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import torch

from nbmonitor.memory import OTHER, ROOT, MemoryRow

StorageKey = Hashable


def storage_of(t: torch.Tensor) -> tuple[StorageKey, int]:
    """A key naming ``t``'s storage (equal for views of one storage) and that storage's bytes."""
    try:
        storage = t.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        # A tensor subclass without one storage (a DTensor, a wrapper): its own elements.
        return id(t), t.numel() * t.element_size()
    if ptr == 0:  # no memory behind it (meta, empty): nothing shared to find
        return id(t), nbytes
    return (t.device, ptr), nbytes


def top_module(name: str) -> str:
    """The top-level module of a qualified parameter or module name (``"0.weight"`` -> ``"0"``)."""
    return name.split(".", 1)[0] if "." in name else ROOT


class Tally:
    """Bytes per (category, module, dtype, device), each storage counted once."""

    def __init__(self, seen: set[StorageKey] | None = None) -> None:
        self.seen: set[StorageKey] = set() if seen is None else seen
        # Keyed by torch's dtype and device objects: made text once per row, not per tensor.
        self.rows: dict[tuple[str, str, Any, Any], list[int]] = {}

    def add(self, category: str, module: str, t: torch.Tensor) -> None:
        key, nbytes = storage_of(t)
        if key in self.seen:
            return
        self.seen.add(key)
        slot = self.rows.setdefault((category, module, t.dtype, t.device), [0, 0])
        slot[0] += nbytes
        slot[1] += 1

    def memory_rows(self) -> list[MemoryRow]:
        return [
            MemoryRow(cat, module, str(dtype).removeprefix("torch."), str(device), nbytes, n)
            for (cat, module, dtype, device), (nbytes, n) in self.rows.items()
        ]


def parameter_storages(model: torch.nn.Module) -> set[StorageKey]:
    """The storages of the model's parameters (a saved weight is a parameter, not an
    activation)."""
    return {storage_of(p)[0] for p in model.parameters()}


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v


def held(
    model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None
) -> tuple[list[MemoryRow], set[StorageKey]]:
    """The rows of the parameters, buffers, gradients and optimizer state, and the storages
    they hold (so that saved activations are not counted again)."""
    tally = Tally()
    where: dict[int, str] = {}
    params: list[torch.Tensor] = []
    if model is not None:
        for name, param in model.named_parameters():
            where[id(param)] = top_module(name)
            params.append(param)
    if optimizer is not None:
        for group in list(optimizer.param_groups):
            for extra in list(group.get("params", ())):
                if isinstance(extra, torch.Tensor) and id(extra) not in where:
                    where[id(extra)] = OTHER
                    params.append(extra)
    for p in params:
        tally.add("parameters", where[id(p)], p)
    if model is not None:
        for name, b in model.named_buffers():
            tally.add("buffers", top_module(name), b)
    for p in params:
        grad = p.grad
        if grad is not None:
            tally.add("gradients", where[id(p)], grad)
    if optimizer is not None:
        # A snapshot of the dict: the training thread may add state while this reads it.
        for owner, state in list(optimizer.state.items()):
            if not isinstance(state, dict):
                continue
            module = where.get(id(owner), OTHER)
            for value in list(state.values()):
                for t in _tensors(value):
                    tally.add("optimizer_state", module, t)
    return tally.memory_rows(), tally.seen
