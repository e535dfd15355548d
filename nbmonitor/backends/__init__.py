"""Device backends and ``select()``, which picks one for a model."""

from __future__ import annotations

import torch

from nbmonitor.backends.base import Backend
from nbmonitor.backends.cpu import CpuBackend

BACKEND_NAMES = ("auto", "cpu", "mps", "cuda")


def model_device_type(model: torch.nn.Module) -> str:
    """The device type of the model's first parameter or buffer ("cpu" when it has none)."""
    for tensor in model.parameters():
        return tensor.device.type
    for tensor in model.buffers():
        return tensor.device.type
    return "cpu"


def select(model: torch.nn.Module, backend: str = "auto") -> Backend:
    """The backend for ``model``: ``"auto"`` picks by where the model's parameters live.

    Raises ValueError for an unknown name and RuntimeError when a forced backend cannot work.
    """
    if backend not in BACKEND_NAMES:
        raise ValueError(
            f"nbmonitor: unknown backend {backend!r}; use one of {', '.join(BACKEND_NAMES)}."
        )
    if backend in ("auto", "cpu"):
        return CpuBackend()
    raise RuntimeError(f"nbmonitor: backend {backend!r} is not available in this build.")


__all__ = ["BACKEND_NAMES", "Backend", "CpuBackend", "model_device_type", "select"]
