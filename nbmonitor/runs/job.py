"""A distributed job on disk (``layout.py``): its ranks read together, or followed together.

``JobFiles(path).ranks`` opens each rank's run (``reader.Run``); ``JobTail(path).poll()``
returns the new records of every rank, and picks up rank folders that appear after it started
(ranks attach at slightly different times). ``JobTail.closed`` once every rank has closed;
``JobTail.ended`` says why the job will get no more records when it never will close: every
rank followed has closed or lost its writer (``Tail.ended``), and the ranks that never
appeared had ``SKEW_S`` seconds to do so (a job folder where no rank ever wrote a run ends
that way too). Any thread, no torch.
"""

from __future__ import annotations

import os
import pathlib
import time
import warnings
from typing import Any

from nbmonitor.runs.decode import Record
from nbmonitor.runs.format import RunDataWarning, RunDirError, RunNotFoundError
from nbmonitor.runs.layout import SKEW_S, is_job, rank_dirs, read_json
from nbmonitor.runs.reader import Run, read_meta, run_path
from nbmonitor.runs.status import STALE_S
from nbmonitor.runs.tail import Tail


def job_status(statuses: list[str], world_size: int) -> str:
    """One status for the job from its ranks': the worst of them, ``running`` while any rank
    runs or has not started yet."""
    if not statuses:
        return "unknown"
    for status in ("running", "killed", "unknown", "degraded", "stopped"):
        if status in statuses:
            return status
    return "running" if len(statuses) < world_size else "closed"


def world_size(meta: dict[str, Any], ranks: int) -> int:
    world = meta.get("world_size")
    return max(world, ranks) if isinstance(world, int) else ranks


class JobFiles:
    """The job folder at ``path``: ``meta`` (the job's meta.json), ``ranks`` (rank -> Run of
    every rank folder that holds a run now). RunNotFoundError when ``path`` is not a job."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = run_path(path)
        self.meta = read_meta(self.path)
        if not is_job(self.path):
            raise RunNotFoundError(
                f"nbmonitor: '{self.path}' is a single run, not a job of several ranks; "
                "open it with nbmonitor.open()."
            )
        self.ranks: dict[int, Run] = {}
        for rank, folder in rank_dirs(self.path).items():
            try:  # one unreadable rank never costs the others
                self.ranks[rank] = Run(folder)
            except RunDirError as exc:
                warnings.warn(RunDataWarning(f"{exc} Rank {rank} is left out."), stacklevel=2)

    @property
    def world_size(self) -> int:
        return world_size(self.meta, len(self.ranks))

    @property
    def status(self) -> str:
        return job_status([run.status for run in self.ranks.values()], self.world_size)


class JobTail:
    """Follows every rank of the job at ``path`` (which may not exist yet); ``streams``
    limits the streams followed. ``stale_s`` is each rank's ``Tail.stale_s``; ``missing_s``
    how long after the last rank appeared the ranks still missing may appear."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        streams: tuple[str, ...] | None = None,
        *,
        stale_s: float = STALE_S,
        missing_s: float = SKEW_S,
    ) -> None:
        self.path = pathlib.Path(path)
        self.streams = streams  # None: every stream
        self.tails: dict[int, Tail] = {}
        self.meta: dict[str, Any] = {}
        self.stale_s = stale_s
        self.missing_s = missing_s
        self._appeared_at = time.monotonic()  # when the last rank folder was first seen

    def poll(self) -> dict[int, dict[str, list[Record]]]:
        """New records per rank and stream since the last poll (ranks with none left out)."""
        meta = read_json(self.path / "meta.json")
        if isinstance(meta, dict):
            self.meta = meta
        for rank, folder in rank_dirs(self.path).items():
            if rank not in self.tails:
                self.tails[rank] = Tail(folder, streams=self.streams, stale_s=self.stale_s)
                self._appeared_at = time.monotonic()
        out: dict[int, dict[str, list[Record]]] = {}
        for rank, tail in self.tails.items():
            new = tail.poll()
            if new:
                out[rank] = new
        return out

    def rank_meta(self, rank: int) -> dict[str, Any]:
        tail = self.tails.get(rank)
        return tail.meta if tail is not None else {}

    @property
    def world_size(self) -> int:
        return world_size(self.meta, len(self.tails))

    @property
    def closed(self) -> bool:
        """True once every rank of the job has closed its run."""
        tails = self.tails
        return (
            bool(tails) and len(tails) >= self.world_size and all(t.closed for t in tails.values())
        )

    @property
    def ended(self) -> str | None:
        """Why the job will get no more records although it never closed, or None: every rank
        followed has closed or its writer is gone (``Tail.ended``: its pid gone on this host,
        or nothing written for ``stale_s`` from another), and no rank still missing can
        appear any more (``missing_s`` passed since the last one did). Read after a poll."""
        tails = self.tails
        if not tails:  # a job folder whose ranks never wrote a run (all died at the start)
            waited = time.monotonic() - self._appeared_at
            if self.meta and waited >= self.missing_s:
                return f"no rank appeared in {waited:.0f} s"
            return None
        if self.closed:
            return None
        said: list[str] = []
        for rank, tail in tails.items():
            why = None if tail.closed else tail.ended
            if not tail.closed and why is None:
                return None  # this rank's writer may still write
            said.append(f"rank {rank} closed" if why is None else f"rank {rank}: {why}")
        world = self.world_size  # from meta.json: may be huge, so only a few are named
        count = world - sum(1 for r in tails if r < world)
        if count > 0:
            if time.monotonic() - self._appeared_at < self.missing_s:
                return None  # a rank that attaches late may still appear
            named = [r for r in range(min(world, len(tails) + 3)) if r not in tails][:3]
            more = f" and {count - len(named)} more" if count > len(named) else ""
            said.append(f"rank{'s' if count > 1 else ''} "
                        f"{', '.join(map(str, named))}{more} never appeared")  # fmt: skip
        return "no rank is writing any more (" + "; ".join(said) + ")"


__all__ = ["JobFiles", "JobTail", "job_status"]
