"""``attach(..., memory_history=True)``: the CUDA allocator's history, for PyTorch's
memory_viz (https://pytorch.org/memory_viz).

``torch.cuda.memory._record_memory_history`` is process-wide: a monitor turns it on at
attach and off at close only if it turned it on (recording the user started stays theirs).
Snapshots (``_dump_snapshot``) are pickles memory_viz opens: the allocator's segments and
the last ``MAX_ENTRIES`` allocation events, each with its stack. The underscore names are
PyTorch's documented API for this (docs: "Understanding CUDA Memory Usage").
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from nbmonitor._atomic import atomic_path

MAX_ENTRIES = 100_000


class MemoryHistory:
    def __init__(self, backend: str) -> None:
        if backend != "cuda":
            raise ValueError(
                "nbmonitor.attach: memory_history=True records the CUDA allocator's history; "
                f"this model trains on {backend!r}. Leave memory_history off."
            )
        self.on = False

    def start(self) -> None:
        torch.cuda.memory._record_memory_history(enabled="all", max_entries=MAX_ENTRIES)  # noqa: SLF001
        self.on = True

    def stop(self) -> None:
        if self.on:
            self.on = False
            torch.cuda.memory._record_memory_history(enabled=None)  # noqa: SLF001

    def dump(self, path: str | os.PathLike[str]) -> Path:
        """Write the snapshot to ``path`` (a pickle) and return it."""
        if not self.on:
            raise RuntimeError(
                "nbmonitor: no allocation history is being recorded; attach with "
                "memory_history=True (on CUDA) to take memory snapshots."
            )
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as tmp:  # whole or not at all, an existing file kept till then
            torch.cuda.memory._dump_snapshot(str(tmp))  # type: ignore[no-untyped-call]  # noqa: SLF001
        return target
