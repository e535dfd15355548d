"""A rank's steering in a distributed job (part of the live entrance): a request made on any rank
(``mon.stop()``, its dashboard) goes to the whole job, naming a step ahead, and every rank's
sampler reads the job's requests and acts at that step (``runs/job_control.py``). No
collective: the ranks meet in the job folder. See docs/steering.md, "A torchrun job"."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nbmonitor._capture.dist import RankInfo
from nbmonitor._capture.steer import Steering
from nbmonitor.errors import ErrorLog
from nbmonitor.runs.control import make_control_dir
from nbmonitor.runs.job_control import (
    RATE_ROWS,
    JobReader,
    Position,
    at_step_for,
    rate_of,
    write_job_request,
)


def job_reader(
    rank: RankInfo | None, job_dir: Path, step: Callable[[], int], errors: ErrorLog
) -> Callable[[Steering], JobReader | None] | None:
    """What makes every rank's reader of the job's control folder (``build_steering`` calls
    it with the rank's steering); None for a single-process run."""
    if rank is None:
        return None

    def make(steering: Steering) -> JobReader | None:
        return _job_reader(rank, job_dir, step, errors, steering)

    return make


def _job_reader(
    rank: RankInfo, job_dir: Path, step: Callable[[], int], errors: ErrorLog, steering: Steering
) -> JobReader | None:
    """The reader, with the control folder made (by whichever rank comes first, mode 0700);
    None when it cannot be made (the rank is then steered alone, and says so in its errors)."""
    try:
        make_control_dir(job_dir)
    except OSError as exc:
        errors.add("steer", exc)
        return None

    def next_boundary() -> int:
        # The step whose end this rank acts at next: a paused rank sits at its step's end.
        done = step()
        return done if steering.paused else done + 1

    def late(file: str, named: int, at: int) -> None:
        # A warning in the run's events (the ranks acted at different steps), not an error:
        # nbmonitor did what it could, and the run is not degraded for it.
        steering.warn_late(
            "steer",
            f"the job's request {file} named step {named} but reached rank {rank.rank} "
            f"later: this rank acts at the end of step {at}, the others at {named}",
            source="job",
        )

    return JobReader(job_dir, rank.rank, next_boundary, late=late)


class JobRoute:
    """``Steering.route`` on a rank: writes a request with no step named to the job folder,
    naming the step this rank will reach after ``steps_ahead`` (from its step rate, read from
    the steps the sampler published, and the sampler interval)."""

    def __init__(
        self,
        job_dir: Path,
        rank: int,
        interval: float,
        step: Callable[[], int],
        columns: Callable[[], Mapping[str, Any]],
    ) -> None:
        self.job_dir = job_dir
        self.rank = rank
        self.interval = interval
        self._step = step
        self._columns = columns

    def __call__(self, kind: str, value: object, source: str) -> bool:
        try:
            cols = self._columns()
            steps = [float(s) for s in cols["step"][-RATE_ROWS:]]
            times = [float(t) for t in cols["time"][-RATE_ROWS:]]
            rate = rate_of(steps, times)
        except (KeyError, TypeError, ValueError):
            rate = math.nan
        now = time.time()
        at_step = at_step_for(Position(self._step(), now, rate), self.interval, now)
        write_job_request(
            self.job_dir, kind, value, at_step=at_step, source=f"rank{self.rank}:{source}"
        )
        return True


__all__ = ["JobRoute", "job_reader"]
