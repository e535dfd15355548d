"""Runs on disk, read and followed: any thread, no torch (numpy only).

>>> run = nbmonitor.runs.open_run("runs/20240605-142233-MLP")  # doctest: +SKIP
>>> run.history()["loss"]  # doctest: +SKIP

``format`` declares the run directory once (streams, files, meta fields); ``reader`` opens a
run, ``tail`` follows one being written, ``catalog`` lists a folder of runs. The writer is
``nbmonitor.sinks.runlog``. See README.md and docs/file-format.md.
"""

from __future__ import annotations

from nbmonitor.runs.catalog import RunTable, list_runs
from nbmonitor.runs.decode import Columns
from nbmonitor.runs.format import (
    FORMAT_VERSION,
    STREAMS,
    RunCorruptError,
    RunDataWarning,
    RunDirError,
    RunNotFoundError,
    RunUnreadableError,
    RunUnsafeError,
    Stream,
)
from nbmonitor.runs.reader import Run, open_run
from nbmonitor.runs.status import STATUSES
from nbmonitor.runs.tail import Tail

__all__ = [
    "FORMAT_VERSION",
    "STATUSES",
    "STREAMS",
    "Columns",
    "Run",
    "RunCorruptError",
    "RunDataWarning",
    "RunDirError",
    "RunNotFoundError",
    "RunTable",
    "RunUnreadableError",
    "RunUnsafeError",
    "Stream",
    "Tail",
    "list_runs",
    "open_run",
]
