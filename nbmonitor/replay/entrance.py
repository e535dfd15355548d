"""The disk entrance: a path opened, followed in a notebook or followed in a terminal; a folder
of several ranks is a job (``replay/job.py``), anything else a run (``replay/run.py``)."""

from __future__ import annotations

import os
import time
from typing import Any

from nbmonitor.replay.follow import Follow
from nbmonitor.replay.job import Job
from nbmonitor.replay.run import Run
from nbmonitor.runs import Tail
from nbmonitor.runs.layout import is_job


def open(path: str | os.PathLike[str]) -> Run | Job:
    """Open a run directory (finished, or being written by another process); a job folder of
    several ranks opens as a ``nbmonitor.Job`` (its ranks, the cross-rank view).

    Needs no torch: a run can be read in a Python without it, by this process or another.
    ``nbmonitor.runs.RunNotFoundError`` (a ``FileNotFoundError`` and a
    ``nbmonitor.RunDirError``) when ``path`` holds no ``meta.json``. The files:
    docs/file-format.md.

    >>> nbmonitor.open("no/such/run")
    Traceback (most recent call last):
    ...
    nbmonitor.runs.format.RunNotFoundError: nbmonitor: no run at 'no/such/run' ...
    """
    if isinstance(path, (str, os.PathLike)) and is_job(os.fspath(path)):
        return Job(path)
    return Run(path)


def tail(path: str | os.PathLike[str], interval: float = 1.0, wait: float = 60.0) -> Any:
    """Follow a run another process is writing, until it closes.

    In a notebook, returns its live dashboard (leave it last in a cell, or display it), which
    reads only the new records every ``interval`` seconds. In a terminal, prints a status line
    every ``interval`` seconds and returns the number of steps once the run closes (as
    ``nbmonitor tail RUN`` does). It ends when the run closes, or its writer is gone: its pid
    gone on this host, or nothing written for 120 s from another host. A run that does not
    exist yet is waited for up to ``wait`` seconds (a path whose parent folder is missing
    too fails at once). A job folder is followed with the ranks panel (a status line across
    ranks in a terminal).
    """
    from nbmonitor.ui.notebook import in_notebook

    if in_notebook():
        return open(path).dashboard(live=True, interval=interval)
    return follow_in_terminal(path, interval, wait)


def follow_in_terminal(
    path: str | os.PathLike[str], interval: float = 1.0, wait: float = 60.0
) -> int:
    """The console view of a run being written, until it closes (or its writer is gone); the
    number of steps seen. A run that does not exist yet is waited for up to ``wait`` seconds
    (RunNotFoundError after that, or at once when its parent folder is missing too)."""
    from nbmonitor.runs.tail import wait_for_run
    from nbmonitor.runs.text import printable
    from nbmonitor.ui.console import ConsoleView, console_logger

    logger = console_logger(install_handler=True)
    if is_job(path):
        from nbmonitor.ui.ranks import RanksConsoleView

        follower = Follow(path, [RanksConsoleView(logger, every=interval)], interval, job=True)
    else:
        follower = Follow(path, [ConsoleView(logger, every=interval)], interval)
        assert isinstance(follower.tail, Tail)
        wait_for_run(follower.tail, wait, say=lambda m: print(printable(m), flush=True))
    try:
        while not follower.refresh():
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    return follower.feed.last_step


__all__ = ["follow_in_terminal", "open", "tail"]
