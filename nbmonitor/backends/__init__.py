"""SAMPLER THREAD: device backends (CPU/RAM, CUDA + NVML, MPS) behind the one ``Backend``
protocol (``base.py``), and ``select()`` (``selection.py``), which picks one for a model.

Importing this package loads neither torch nor a driver: the names load lazily, so the
sampler-side packages can name the ``Backend`` protocol without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbmonitor._lazy import lazy_names
from nbmonitor.backends.base import Backend

if TYPE_CHECKING:
    from nbmonitor.backends.cpu import CpuBackend
    from nbmonitor.backends.cuda import CudaBackend, decode_throttle
    from nbmonitor.backends.mps import MpsBackend
    from nbmonitor.backends.selection import BACKEND_NAMES, model_device, model_device_type, select

_WHERE = {
    "BACKEND_NAMES": "selection",
    "model_device": "selection",
    "model_device_type": "selection",
    "select": "selection",
    "CpuBackend": "cpu",
    "CudaBackend": "cuda",
    "decode_throttle": "cuda",
    "MpsBackend": "mps",
}


__getattr__ = lazy_names(__name__, {k: f"nbmonitor.backends.{v}" for k, v in _WHERE.items()})


__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "CpuBackend",
    "CudaBackend",
    "MpsBackend",
    "decode_throttle",
    "model_device",
    "model_device_type",
    "select",
]
