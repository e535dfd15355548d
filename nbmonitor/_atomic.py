"""Writing a whole file so that nobody ever sees half of it: the bytes go to a temporary file
beside the target (same folder, so the same filesystem) and ``os.replace`` puts it in place.
A reader sees the old file or the new one; a process killed or a write failing halfway leaves
the old file whole (and at most a hidden ``.<name>.<pid>.<thread>.tmp`` beside it). Shared by
every layer that writes a file other than an append-only stream (runs/, the profiler in
_capture/, the terminal app's snapshot in ui/, memory snapshots in live/), which may not
import each other. Stdlib only."""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
from collections.abc import Iterator


def temp_beside(target: pathlib.Path) -> pathlib.Path:
    """A temporary name in ``target``'s folder, unique to this process and thread, hidden."""
    return target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[pathlib.Path]:
    """A temporary path to write ``path``'s new content to (for writers that take a path:
    ``export_chrome_trace``, ``to_parquet``); on leaving the block without an error it
    replaces ``path``, else it is removed and ``path`` is left as it was."""
    target = pathlib.Path(path)
    tmp = temp_beside(target)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # gone after the replace; a half file after a failure


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file beside it and ``os.replace``."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


__all__ = ["atomic_path", "temp_beside", "write_atomic"]
