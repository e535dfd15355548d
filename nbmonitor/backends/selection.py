"""``select()``: the backend for a model, picked by where its parameters live.

pynvml is imported by ``select()`` (to decide) and initialised by the CUDA backend's first
``sample()`` on the sampler thread.
"""

from __future__ import annotations

import itertools

import torch

from nbmonitor.backends import _nvml
from nbmonitor.backends.base import Backend
from nbmonitor.backends.cpu import CpuBackend
from nbmonitor.backends.cuda import CudaBackend
from nbmonitor.backends.mps import MpsBackend

BACKEND_NAMES = ("auto", "cpu", "mps", "cuda")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU when it has none)."""
    tensor = next(itertools.chain(model.parameters(), model.buffers()), None)
    return torch.device("cpu") if tensor is None else tensor.device


def model_device_type(model: torch.nn.Module) -> str:
    """The device type of the model's first parameter or buffer ("cpu" when it has none)."""
    return model_device(model).type


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _cuda_backend(index: int | None, notes: list[str]) -> CudaBackend:
    if index is None:
        index = torch.cuda.current_device()
    # Only the import is checked here; nvmlInit waits for the sampler thread. A CUDA model
    # without NVML still gets the allocator stats, which CPU stats would lose.
    nvml, reason = _nvml.load()
    if nvml is None:
        notes.append(f"NVML fields are NaN: {reason}")
    return CudaBackend(index, use_nvml=nvml is not None, notes=notes)


def select(model: torch.nn.Module, backend: str = "auto") -> Backend:
    """The backend for ``model``: ``"auto"`` picks by where the model's parameters live.

    Raises ValueError for an unknown name and RuntimeError when a forced backend cannot work.
    Anything worth telling the user about the choice is in the backend's ``notes`` (CUDA).
    """
    if backend not in BACKEND_NAMES:
        raise ValueError(
            f"nbmonitor: unknown backend {backend!r}; use one of {', '.join(BACKEND_NAMES)}."
        )
    device = model_device(model)
    if backend == "cpu":
        return CpuBackend()
    if backend == "auto":
        if device.type == "cuda":
            return _cuda_backend(device.index, [])
        if device.type == "mps":
            return MpsBackend()
        return CpuBackend()
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "nbmonitor: backend='cuda' but torch.cuda.is_available() is False; "
                "use backend='auto' or 'cpu'."
            )
        notes = []
        if device.type != "cuda":
            notes.append(f"backend='cuda' forced while the model is on {device.type}.")
        return _cuda_backend(device.index if device.type == "cuda" else None, notes)
    if not _mps_available():
        raise RuntimeError(
            "nbmonitor: backend='mps' but torch.backends.mps.is_available() is False; "
            "use backend='auto' or 'cpu'."
        )
    return MpsBackend()
