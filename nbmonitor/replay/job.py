"""A distributed job on disk, opened or followed: the replay entrance's half for jobs.

``nbmonitor.open(job_dir)`` and ``nbmonitor.tail(job_dir)`` come here when the folder is a job
of several ranks (``nbmonitor/runs/layout.py``). Every rank's streams are read (``runs/``),
put in a ``RankState`` (``_engine/derive/ranks.py``), judged by the straggler rule and the
agreement checks, and drawn by the ranks panel (``ui/ranks.py``). Nothing here needs torch,
and nothing talks to the ranks: the files are the only channel. Rank 0 (the display rank)
writes ``ranks_summary.json`` at close through ``live/ranks.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nbmonitor._engine.derive.job_report import read_state, straggler_alerts
from nbmonitor._engine.derive.ranks import (
    RankState,
    align,
    divergence,
    per_step,
    rank_columns,
    ranks_summary,
)
from nbmonitor._engine.derive.ranks_frame import RanksFrame, ranks_frame
from nbmonitor.health import Alert, Health, HealthInput, Thresholds
from nbmonitor.health.rules.stragglers import Stragglers
from nbmonitor.replay.run import Run
from nbmonitor.runs.job import JobFiles, JobTail, job_status


class Job:
    """A job of several ranks on disk, finished or still running. Create it with
    :func:`nbmonitor.open` on the job folder.

    ``ranks`` maps each rank to its run (``nbmonitor.Run``: its own ``history()``,
    ``dashboard()``...); ``per_step()`` is the cross-rank table of step times;
    ``summary()`` the cross-rank summary (computed in memory; the writer's rank 0 writes
    ``ranks_summary.json`` at close); ``alerts()`` the stragglers and disagreeing ranks;
    ``dashboard()`` the ranks panel, live with ``live=True``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._files = JobFiles(path)
        self.path = self._files.path
        self.meta = self._files.meta
        self.ranks = {r: Run(run.path) for r, run in self._files.ranks.items()}
        self._follow: JobFollow | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def world_size(self) -> int:
        return self._files.world_size

    @property
    def status(self) -> str:
        return job_status([run.status for run in self.ranks.values()], self.world_size)

    def state(self) -> RankState:
        return read_state(self._files.ranks)

    def export(
        self, to: Any, progress: Callable[[int, int], None] | None = None, **options: Any
    ) -> list[Path]:
        """Hand every rank of this job, as it is on disk now, on to ``to`` (see
        ``nbmonitor.Run.export``); each rank goes as its own run (``rank<r>``). Returns where
        each went."""
        from nbmonitor.export import export_run

        return [Path(e.where) for e in export_run(self.path, to, progress, **options)]

    def to_parquet(self, out: str | os.PathLike[str]) -> list[Path]:
        """Every rank's tables as ``<out>/rank<r>/<table>.parquet``; the paths."""
        return [
            p
            for r, run in sorted(self.ranks.items())
            for p in run.to_parquet(Path(out) / f"rank{r}")
        ]

    def to_csv(self, out: str | os.PathLike[str]) -> list[Path]:
        """Every rank's tables as ``<out>/rank<r>/<table>.csv``; the paths."""
        return [
            p for r, run in sorted(self.ranks.items()) for p in run.to_csv(Path(out) / f"rank{r}")
        ]

    def history(self, rank: int = 0) -> Mapping[str, Any]:
        """One rank's per-step columns (rank 0 by default)."""
        return self.ranks[rank].history()

    def per_step(self) -> dict[str, Any]:
        """Per step across ranks: ``step``, step time ``min``, ``median``, ``max`` and the
        ``slowest_rank`` (float64 columns)."""
        state = self.state()
        steps, matrix = align(state, "step_time")
        return per_step(steps, matrix, sorted(state.ranks))

    def alerts(self) -> list[Alert]:
        state = self.state()
        return straggler_alerts(state) + divergence(state)

    def summary(self) -> dict[str, dict[str, float]]:
        """Oumi-style cross-rank summary (count, mean, median, std, min, max, min_rank,
        max_rank) of step time, data wait and each device metric, computed in memory:
        reading never writes into the folder it reads (rank 0 writes ``ranks_summary.json``
        at close)."""
        return ranks_summary(self.state())

    def frame(self, heat_metric: str = "step_time") -> RanksFrame:
        state = self.state()
        alerts = straggler_alerts(state) + divergence(state)
        return ranks_frame(state, self.name, self.status, self.world_size, alerts, heat_metric)

    def dashboard(self, live: bool = False, interval: float = 1.0) -> Any:
        """The ranks panel of this job; with ``live=True`` it follows the job until every rank
        has closed (or ``stop()``)."""
        from nbmonitor.ui.ranks import RanksPanel

        panel = RanksPanel(self.name)
        if live:
            self.stop()
            self._follow = JobFollow(self.path, [panel], interval)
            self._follow.start()
        else:
            panel.close(self.frame())
        return panel

    def stop(self) -> None:
        if self._follow is not None:
            self._follow.stop()
            self._follow = None

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.dashboard()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"<nbmonitor.Job {self.name!r} ranks={sorted(self.ranks)} status={self.status!r}>"


class JobFollow:
    """Reads the new records of every rank every ``interval`` seconds on a daemon thread
    (``nbmonitor-tail``) and publishes ranks frames to views, until every rank closed."""

    def __init__(self, path: str | os.PathLike[str], views: Sequence[Any], interval: float) -> None:
        if not (isinstance(interval, (int, float)) and interval > 0):
            raise ValueError(f"nbmonitor.tail: interval must be > 0 seconds, got {interval!r}.")
        self.tail = JobTail(path)
        self.views = tuple(views)
        self.interval = float(interval)
        self.state = RankState()
        self.health = Health(Thresholds(), rules=(Stragglers,))
        self.alerts: list[Alert] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbmonitor-tail", daemon=True)

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
        """Read what is new and publish a frame; True once every rank has closed."""
        tail = self.tail
        for rank, streams in tail.poll().items():
            for stream in ("steps", "system"):
                if streams.get(stream):
                    self.state.add_rows(rank, stream, streams[stream])
        for rank, rank_tail in tail.tails.items():
            status = "closed" if rank_tail.closed else "running"
            self.state.set_meta(rank, rank_tail.meta, status)
        self._judge()
        closed = tail.closed
        status = "closed" if closed else "running"
        frame = ranks_frame(self.state, tail.path.name, status, tail.world_size, self.alerts)
        for view in self.views:
            (view.close if closed else view.publish)(frame)
        return closed

    def _judge(self) -> None:
        columns = rank_columns(self.state)
        if columns is not None:
            inp = HealthInput(step=int(columns.steps[-1]) if columns.steps.size else 0,
                              time=time.time(), steps={}, ranks=columns)  # fmt: skip
            self.alerts += self.health.check(inp)
        seen = {(a.rule, a.subject) for a in self.alerts}
        self.alerts += [
            a for a in divergence(self.state, time.time()) if (a.rule, a.subject) not in seen
        ]

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


def follow_job_in_terminal(path: str | os.PathLike[str], interval: float = 1.0) -> int:
    """The console view of a job being written, until every rank closed; the newest step."""
    from nbmonitor.ui.console import console_logger
    from nbmonitor.ui.ranks import RanksConsoleView

    view = RanksConsoleView(console_logger(install_handler=True), every=interval)
    follower = JobFollow(path, [view], interval)
    try:
        while not follower.refresh():
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    steps, _ = align(follower.state, "step_time")
    return int(steps[-1]) if steps.size else 0


__all__ = [
    "Job",
    "JobFollow",
    "follow_job_in_terminal",
]
