"""The zero-sync check shared by the GPU tests."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def no_sync_allowed() -> Iterator[None]:
    """Inside, any synchronising CUDA call raises; the mode is off again however it ends."""
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        # torch warns once that the mode is a prototype; this suite turns warnings into errors
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
            torch.cuda.set_sync_debug_mode(0)
