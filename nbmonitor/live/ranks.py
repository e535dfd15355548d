"""The live monitor's parts for one rank of a distributed job (``monitor.py`` calls these):
the run log in the job folder, the display rank's follower of the other ranks, and the
cross-rank summary at close. Single-process runs go through none of it."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbmonitor._capture.dist import RankInfo
from nbmonitor._engine.derive.job_report import job_alerts, read_state, summary_record
from nbmonitor._engine.derive.ranks import RankState, rank_columns
from nbmonitor._engine.handover import Pause
from nbmonitor.errors import ErrorLog
from nbmonitor.health.rules.stragglers import WINDOW
from nbmonitor.health.view import RankColumns
from nbmonitor.options import Options
from nbmonitor.runs.format import write_json_atomic
from nbmonitor.runs.job import JobFiles, JobTail, job_status
from nbmonitor.runs.layout import SUMMARY, is_job
from nbmonitor.sinks import RunLogSink


def check_display_rank(rank: RankInfo | None, display_rank: int) -> None:
    """A display rank outside the job's world would leave every rank silent: a one-line error."""
    if rank is not None and display_rank >= rank.world_size:
        raise ValueError(
            f"nbmonitor.attach: display_rank={display_rank} is not a rank of this job "
            f"(world size {rank.world_size}); pass display_rank= from 0 to "
            f"{rank.world_size - 1}."
        )


def create_runlog(
    opts: Options,
    run_name: str,
    meta: dict[str, object],
    rank: RankInfo | None,
    device: str,
    device_index: int | None,
) -> tuple[RunLogSink, str]:
    """The run log and the run's name: ``<stamp>-<name>`` alone, or a rank's
    ``<job>-<name>/rank<r>`` with its place in the job in meta.json. It encodes its rows in
    slices, handing the GIL over between two (``_engine/handover.py``), until a tick brings
    enough of them for its writer process to take them (``sinks/writer.py``)."""
    pause = Pause()  # the run log's worker's own
    if rank is None:
        log = RunLogSink.create(opts.run_dir, run_name, meta, pause=pause, offload=True)
        return log, log.path.name
    meta.update(rank.as_meta(), device=device, device_index=device_index)
    log = RunLogSink.create(
        opts.run_dir, run_name, meta, job_id=rank.job_id, rank=rank.rank,
        world_size=rank.world_size, pause=pause, offload=True,
    )  # fmt: skip
    return log, f"{log.path.parent.name}/{log.path.name}"


def rank_follower(rank: RankInfo | None, displays: bool, run_dir: Any) -> Callable[[], Any] | None:
    """On the display rank: every rank's steps and system samples, read from their files, for
    the job rules (the pipeline calls it on the run log's worker)."""
    if rank is None or not displays:
        return None
    return RankFollower(run_dir.parent)


class RankFollower:
    """On the display rank, live: every rank's step columns and newest system samples (the
    steps it has done and the phase it is in, even while its training thread is blocked),
    read from their files (the sampler thread calls it at each health check), as the job
    rules' input: stragglers, ranks on the same batches, a stalled rank."""

    def __init__(self, job_dir: str | os.PathLike[str], max_steps: int = 4 * WINDOW) -> None:
        self.tail = JobTail(job_dir, streams=("steps", "system"))
        self.state = RankState(max_steps)

    def __call__(self) -> RankColumns | None:
        for rank, streams in self.tail.poll().items():
            for stream in ("steps", "system"):
                if streams.get(stream):
                    self.state.add_rows(rank, stream, streams[stream])
        for rank, rank_tail in self.tail.tails.items():
            self.state.set_meta(rank, rank_tail.meta)
        return rank_columns(self.state)


def finish(job_dir: str | os.PathLike[str]) -> str | None:
    """At the display rank's close: write ranks_summary.json from what every rank has written
    so far, and return the summary as text (None when there is no job there)."""
    from nbmonitor.ui.ranks import summary_text

    path = Path(job_dir)
    if not is_job(path):
        return None
    files = JobFiles(path)
    state = read_state(files.ranks)
    status = job_status([run.status for run in files.ranks.values()], files.world_size)
    record = summary_record(files.meta, state, status)
    write_json_atomic(path / SUMMARY, record)
    text = summary_text(path.name, record["summary"])
    alerts = job_alerts(state)
    if alerts:
        text += "\n" + "\n".join(f"  {a.message}" for a in alerts)
    return text


def finish_job(job_dir: Any, errors: ErrorLog, display: bool, wait: float) -> None:
    """At the display rank's close: ranks_summary.json from every rank's files, then the
    summary on the console. On a worker: a filesystem that hangs costs at most ``wait``."""
    from nbmonitor._engine.isolated import Isolated
    from nbmonitor.ui.console import console_logger

    worker = Isolated("ranks-summary", "the cross-rank summary", errors, wait)
    try:
        text = worker.call(functools.partial(finish, job_dir))
    except Exception as exc:  # never from close(): the job's own files are written
        errors.add("ranks_summary", exc)
        return
    finally:
        worker.close(0.0)
    if isinstance(text, str) and display:  # display=False: the file alone, nothing printed
        console_logger(install_handler=True).info(text)


__all__ = [
    "RankFollower",
    "check_display_rank",
    "create_runlog",
    "finish",
    "finish_job",
    "rank_follower",
]
