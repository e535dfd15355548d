"""GPU tests: torch's sync debug mode is process-wide, so no test may leave it on (one that
did turned every later ``.cuda()`` into an error, the first time these tests met a GPU)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def sync_debug_mode_off() -> Iterator[None]:
    yield
    if torch.cuda.is_available():
        with warnings.catch_warnings():
            # torch warns once per process that the mode is a prototype, whatever the mode
            warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
            torch.cuda.set_sync_debug_mode(0)
