"""The one follower of a run or a job that another process is writing: it reads what is new
every interval on a daemon thread (``nbmonitor-tail``) and publishes frames to views, until
the run (or every rank of the job) has closed, or ``stop()``.

What is read and what is drawn is the feed's: a run's records go into the run model
(``RunFeed``: the dashboard's Frame), a job's into the cross-rank state (``JobFeed``: the ranks
panel's RanksFrame). Whether a path is a run or a job is decided once, by the caller.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from nbmonitor._engine.derive.job_report import (
    NOW_RULES,
    STEP_RULES,
    now_alerts,
    straggler_alerts,
)
from nbmonitor._engine.derive.ranks import RankState, align
from nbmonitor._engine.derive.ranks_frame import ranks_frame
from nbmonitor._engine.run_state import RunState
from nbmonitor.health import Alert, Health, Thresholds
from nbmonitor.runs import Tail
from nbmonitor.runs.job import JobTail
from nbmonitor.runs.layout import is_job
from nbmonitor.runs.status import run_status


def run_name(path: Path) -> str:
    """A run's name as its live monitor called it: ``<job>/rank<r>`` for a rank of a job."""
    return f"{path.parent.name}/{path.name}" if is_job(path.parent) else path.name


def end_status(tail: Tail) -> str:
    """How a followed run ended: ``closed``, or (its writer gone without closing, which is
    not a closed run) ``killed`` when its pid is gone on this host, ``unknown`` when a writer
    on another host fell silent."""
    return "closed" if tail.closed else run_status(tail.meta, [])


class Feed(Protocol):
    """What a follower reads and draws."""

    def read(self) -> bool:
        """Take what is new; True once the writer has closed (or is gone)."""

    def frame(self, closed: bool) -> Any:
        """What the views show now."""

    @property
    def last_step(self) -> int:
        """The newest step read."""


class RunFeed:
    """A run being written: its new records, into the run model every dashboard draws."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.tail = Tail(path)
        self.state: RunState | None = None

    def read(self) -> bool:
        new = self.tail.poll()
        if self.state is None:
            self.state = RunState(self.tail.meta, run_name(Path(self.tail.path)))
        self.state.add_rows(new)
        # A writer that died without closing (runs/tail.py, ``ended``) ends the follow too.
        return bool(self.tail.closed) or self.tail.ended is not None

    def frame(self, closed: bool) -> Any:
        assert self.state is not None
        return self.state.frame(end_status(self.tail) if closed else "running")

    @property
    def last_step(self) -> int:
        return self.state.model.last_step if self.state is not None else 0


class JobFeed:
    """A job being written: every rank's new records, judged by the job rules as they come,
    as the ranks panel shows them."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.tail = JobTail(path)
        self.state = RankState()
        self.health = Health(Thresholds(), rules=STEP_RULES)
        self.now_health = Health(Thresholds(), rules=NOW_RULES)
        self.alerts: list[Alert] = []
        self._judged = 0

    def read(self) -> bool:
        tail = self.tail
        for rank, streams in tail.poll().items():
            for stream in ("steps", "system"):
                if streams.get(stream):
                    self.state.add_rows(rank, stream, streams[stream])
        for rank, rank_tail in tail.tails.items():
            status = "closed" if rank_tail.closed else "running"
            self.state.set_meta(rank, rank_tail.meta, status)
        self._judge()
        # Every rank's writer gone (or closed) ends the follow too (runs/job.py, ``ended``).
        return bool(tail.closed) or tail.ended is not None

    def _judge(self) -> None:
        # The steps every rank has recorded since the last look, as a job opened whole is
        # judged (job_report.py).
        self.alerts += straggler_alerts(self.state, self.health, since=self._judged)
        self._judged = align(self.state, "step_time")[0].size
        self.alerts += now_alerts(self.state, self.now_health)

    def frame(self, closed: bool) -> Any:
        tail = self.tail
        status = "running"
        if closed:  # the worst of the ranks' ends: a rank whose writer is gone did not close
            ends = {end_status(t) for t in tail.tails.values()}
            status = next((s for s in ("killed", "unknown") if s in ends), "closed")
        return ranks_frame(self.state, tail.path.name, status, tail.world_size, self.alerts)

    @property
    def last_step(self) -> int:
        steps, _ = align(self.state, "step_time")
        return int(steps[-1]) if steps.size else 0


class Follow:
    """Follows ``path`` (a run, or a job with ``job=True``) and publishes its frames to
    ``views`` every ``interval`` seconds on a daemon thread, until it closes or ``stop()``;
    ``refresh()`` does one round on the caller's thread (the terminal follows that way)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        views: Sequence[Any],
        interval: float = 1.0,
        *,
        job: bool = False,
    ) -> None:
        if not (isinstance(interval, (int, float)) and interval > 0):
            raise ValueError(f"nbmonitor.tail: interval must be > 0 seconds, got {interval!r}.")
        self.feed: RunFeed | JobFeed = JobFeed(path) if job else RunFeed(path)
        self.views = tuple(views)
        self.interval = float(interval)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbmonitor-tail", daemon=True)

    @property
    def tail(self) -> Tail | JobTail:
        return self.feed.tail

    @property
    def state(self) -> RunState | RankState | None:
        return self.feed.state

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def refresh(self) -> bool:
        """Read what is new and publish a frame; True once the run (every rank) has closed."""
        closed = self.feed.read()
        frame = self.feed.frame(closed)
        for view in self.views:
            (view.close if closed else view.publish)(frame)
        return closed

    def _run(self) -> None:
        while True:
            try:
                if self.refresh():
                    return
            except Exception as exc:  # a torn or vanished file must not kill the follower
                self.errors.append(f"{type(exc).__name__}: {exc}")
                del self.errors[:-20]
            if self._stop.wait(self.interval):
                return


__all__ = ["Feed", "Follow", "JobFeed", "RunFeed", "end_status", "run_name"]
