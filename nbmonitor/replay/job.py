"""A distributed job on disk, opened or followed: the replay entrance's half for jobs.

``nbmonitor.open(job_dir)`` and ``nbmonitor.tail(job_dir)`` come here when the folder is a job
of several ranks (``nbmonitor/runs/layout.py``). Every rank's streams are read (``runs/``),
put in a ``RankState`` (``_engine/derive/ranks.py``), judged by the job rules (stragglers,
same batches, ranks out of sync, a stalled rank or job), and drawn by the ranks panel
(``ui/ranks.py``). Nothing here needs torch, and nothing talks to the ranks: the files are the
only channel. Rank 0 (the display rank) writes ``ranks_summary.json`` at close through
``live/ranks.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nbmonitor._engine.derive.job_report import job_alerts, read_state
from nbmonitor._engine.derive.ranks import (
    RankState,
    align,
    per_step,
    ranks_summary,
)
from nbmonitor._engine.derive.ranks_frame import RanksFrame, ranks_frame
from nbmonitor.health import Alert
from nbmonitor.replay.follow import Follow
from nbmonitor.replay.run import Run
from nbmonitor.runs.job import JobFiles, job_status


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
        self._follow: Follow | None = None

    @property
    def name(self) -> str:
        """The job folder's name."""
        return self.path.name

    @property
    def world_size(self) -> int:
        """The job's number of ranks (from its ``meta.json``, or the rank folders found)."""
        return self._files.world_size

    @property
    def status(self) -> str:
        """The worst status of its ranks (``running`` while a rank has not started)."""
        return job_status([run.status for run in self.ranks.values()], self.world_size)

    def state(self) -> RankState:
        """The ranks as they are on disk now, in the stores the ranks panel is drawn from."""
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
        """The job's alerts, judged on the ranks' files: stragglers (rule ``straggler``), ranks
        fed the same batches (``same_batches``, subject the group's lowest rank), a rank that
        stalls the job (``rank_stalled``, judged on where the ranks' files say they are last)
        and ranks whose grad norm or loss disagrees with the others' (``rank_divergence``);
        subject ``rank<r>``, the message names the host."""
        state = self.state()
        return job_alerts(state)

    def summary(self) -> dict[str, dict[str, float]]:
        """Oumi-style cross-rank summary (count, mean, median, std, min, max, min_rank,
        max_rank) of step time, data wait and each device metric, computed in memory:
        reading never writes into the folder it reads (rank 0 writes ``ranks_summary.json``
        at close)."""
        return ranks_summary(self.state())

    def frame(self, heat_metric: str = "step_time") -> RanksFrame:
        """What the ranks panel shows now: a ranks x steps heatmap of ``heat_metric``, the
        alerts, the newest steps, one row per rank and the summary."""
        state = self.state()
        alerts = job_alerts(state)
        return ranks_frame(state, self.name, self.status, self.world_size, alerts, heat_metric)

    def dashboard(self, live: bool = False, interval: float = 1.0) -> Any:
        """The ranks panel of this job; with ``live=True`` it follows the job until every rank
        has closed (or ``stop()``)."""
        from nbmonitor.ui.ranks import RanksDashboard

        panel = RanksDashboard(self.name)
        if live:
            self.stop()
            self._follow = Follow(self.path, [panel], interval, job=True)
            self._follow.start()
        else:
            panel.close(self.frame())
        return panel

    def stop(self) -> None:
        """Stop following the job (``dashboard(live=True)``); idempotent."""
        if self._follow is not None:
            self._follow.stop()
            self._follow = None

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.dashboard()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"<nbmonitor.Job {self.name!r} ranks={sorted(self.ranks)} status={self.status!r}>"


__all__ = ["Job"]
