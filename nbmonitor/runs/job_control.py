"""Steering a distributed job: one request for every rank, acted on at the same step by all.

The ranks of a data-parallel job must stop (or pause, checkpoint, change the learning rate) at
the same step: a rank that stops while the others go on leaves them waiting in the next
collective for good. nbmonitor adds no collective to the step. Instead a request to the job
names a step a little ahead, ``at_step``, far enough that every rank's sampler reads it before
its training thread gets there, and each rank acts at the end of exactly that step:

```
runs/<job>-<name>/control/<time>-<pid>.json   {"kind": "stop", "at_step": 1412, "source": ...}
```

The file is written as ``control.py`` writes a run's requests (atomically, mode 0600) and read
by every rank's sampler at each tick with the same checks (a regular file of the run's owner,
not writable by group or others, small, plain JSON); unlike a run's own requests it is *kept*
(every rank reads it), and each rank remembers the names it took (``JobReader``).

The step is chosen by whoever asks: ``nbmonitor ctl JOB ...`` from the ranks' files (their
last step, its time and the recent step rate), a rank's monitor (``mon.stop()``, its dashboard)
from its own count. Ahead by the steps the job makes in ``AHEAD_TICKS`` sampler intervals plus
``SLACK_S`` (``steps_ahead``), at least ``MIN_AHEAD``. A rank that reads a request after the
step it names (a sampler held up for longer than that) acts at its next step and says so in
its errors. While the job is paused every request applies at the step it paused at (the
steering applies everything pending while paused), so a stop sent to a paused job ends it
there, and a resume applies no earlier than the last pause it read. Any thread, no torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from nbmonitor.runs.control import (
    CONTROL,
    ControlError,
    ControlReader,
    ControlRequest,
    Refused,
    control_dir,
    parse_verb,
    send,
    write_request,
)

# Sampler intervals every rank gets to read a request before the step it names (a rank's
# sampler reads the folder once a tick; the asker's view of the step can be a tick old).
AHEAD_TICKS = 3
# Seconds on top: a loaded machine or a slow shared filesystem delays a tick.
SLACK_S = 2.0
# The fewest steps ahead a request names, and what it names when no rate is known yet.
MIN_AHEAD = 3
UNKNOWN_RATE_AHEAD = 20
# The rows the step rate is read from (the last ones), and the longest a position read from
# files is carried forward at that rate (files older than this: the job is paused or stalled,
# and a paused job takes any request at the step it paused at anyway).
RATE_ROWS = 20
MAX_CARRY_S = 30.0


@dataclass(frozen=True)
class Position:
    """Where a job (or a rank) is: the last step known, the wall time it ended (seconds since
    the epoch) and the step rate (steps per second, NaN when unknown)."""

    step: int
    time: float
    rate: float

    def now(self, now: float) -> float:
        """The step the job is at ``now``, carried forward at its rate (at most
        ``MAX_CARRY_S``)."""
        if not math.isfinite(self.rate) or self.rate <= 0 or not math.isfinite(self.time):
            return float(self.step)
        return self.step + self.rate * min(max(now - self.time, 0.0), MAX_CARRY_S)


def steps_ahead(rate: float, interval: float) -> int:
    """How many steps ahead of the current one a job request names: the steps made in
    ``AHEAD_TICKS`` sampler intervals plus ``SLACK_S``, at least ``MIN_AHEAD``."""
    if not math.isfinite(rate) or rate <= 0:
        return UNKNOWN_RATE_AHEAD
    if not math.isfinite(interval) or interval <= 0:
        interval = 0.5
    return max(MIN_AHEAD, math.ceil(rate * (AHEAD_TICKS * interval + SLACK_S)) + MIN_AHEAD)


def at_step_for(position: Position, interval: float, now: float | None = None) -> int:
    """The step a request made ``now`` names, for a job at ``position``."""
    now = time.time() if now is None else now
    return math.floor(position.now(now)) + steps_ahead(position.rate, interval)


def rate_of(steps: list[float], times: list[float]) -> float:
    """Steps per second over the last ``RATE_ROWS`` rows (NaN with fewer than two, or no
    time between them)."""
    pairs = [
        (s, t) for s, t in zip(steps, times, strict=False) if math.isfinite(s) and math.isfinite(t)
    ][-RATE_ROWS:]
    if len(pairs) < 2:
        return math.nan
    (s0, t0), (s1, t1) = pairs[0], pairs[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else math.nan


def job_position(job_dir: str | os.PathLike[str]) -> tuple[Position, float]:
    """Where a running job is, from its ranks' files: the furthest rank's last step and its
    time, the fastest rank's rate; and the job's sampler interval (the ranks' largest).
    ``RunNotFoundError`` when it is not a job."""
    from nbmonitor.runs.job import JobFiles

    files = JobFiles(job_dir)
    best = Position(0, math.nan, math.nan)
    rates: list[float] = []
    interval = 0.0
    for run in files.ranks.values():
        attach = run.meta.get("attach")
        got = attach.get("interval") if isinstance(attach, dict) else None
        if isinstance(got, (int, float)) and math.isfinite(got) and got > 0:
            interval = max(interval, float(got))
        columns = run.history()
        if not columns.rows:
            continue
        steps = [float(s) for s in columns["step"][-RATE_ROWS:]]
        times = [float(t) for t in columns["time"][-RATE_ROWS:]] if "time" in columns else []
        rate = rate_of(steps, times)
        if math.isfinite(rate):
            rates.append(rate)
        last = steps[-1]
        if math.isfinite(last) and last >= best.step:
            best = Position(int(last), times[-1] if times else math.nan, math.nan)
    rate = max(rates) if rates else math.nan
    return dataclasses.replace(best, rate=rate), interval or 0.5


def write_job_request(
    job_dir: str | os.PathLike[str],
    kind: str,
    value: object = None,
    *,
    at_step: int,
    source: str = "ctl",
) -> pathlib.Path:
    """Write a request for every rank of the job, to act on at the end of step ``at_step``
    (``FileNotFoundError`` when the job has no control folder: no rank of it is live)."""
    return write_request(job_dir, kind, value, source=source, at_step=at_step)


def send_to(folder: str | os.PathLike[str], verb: str, *, wait: float = 5.0) -> str:
    """``nbmonitor ctl FOLDER VERB``: to a job (``send_job``) or a single run
    (``control.send``); what happened, in one line, or ``ControlError``."""
    from nbmonitor.runs.layout import is_job

    if is_job(folder):
        kind, value = parse_verb(verb)
        return send_job(folder, kind, value)
    return send(folder, verb, wait=wait)


def send_job(job_dir: str | os.PathLike[str], kind: str, value: object = None) -> str:
    """``nbmonitor ctl JOB ...``: write ``kind`` for every rank of the running job at
    ``job_dir``, naming a step ahead from the ranks' files; what was asked, in one line.
    ``ControlError`` (one line, with the exit status) when no rank runs or the job takes no
    requests."""
    from nbmonitor.runs.job import JobFiles, job_status

    path = pathlib.Path(job_dir)
    name = path.name
    files = JobFiles(path)
    status = job_status([run.status for run in files.ranks.values()], files.world_size)
    if status != "running":
        raise ControlError(f"the job {name} is not running ({status}); nothing to steer")
    folder = control_dir(path)
    if not folder.is_dir():
        raise ControlError(
            f"the job {name} takes no requests (no {CONTROL}/ folder: written by an older "
            "nbmonitor); steer its ranks' own folders"
        )
    position, interval = job_position(path)
    at_step = at_step_for(position, interval)
    try:
        write_job_request(path, kind, value, at_step=at_step, source="ctl")
    except PermissionError:
        raise ControlError(
            f"cannot write to {folder}: permission denied (only the user who runs it can "
            "steer a job)"
        ) from None
    what = kind if not isinstance(value, float) else f"{kind}={value:g}"
    if kind == "checkpoint" and value is not None:
        what = f"{kind} {value} (each rank's with -rank<r> before its suffix)"
    if kind == "resume":
        return f"sent {what} to every rank of {name}; a paused job resumes at once"
    return (
        f"sent {what} to every rank of {name}: each acts at the end of step {at_step} (the job "
        f"was near step {position.step}; a paused job acts where it paused)"
    )


class JobReader:
    """One rank's reader of its job's requests (every rank reads every one; none removed).

    ``rank``: the reading rank (a checkpoint path given in a request gets ``-rank<r>`` before
    its suffix, so that the ranks do not write one file). ``next_boundary``: the step whose
    end the rank acts at next; ``late(file, named, at)`` is called for a request that names
    an earlier step (read too late: the rank acts at ``at`` instead)."""

    def __init__(
        self,
        job_dir: str | os.PathLike[str],
        rank: int,
        next_boundary: Callable[[], int],
        *,
        late: Callable[[str, int, int], None] | None = None,
        uid: int | None = None,
    ) -> None:
        self.reader = ControlReader(job_dir, uid=uid, keep=True)
        self.rank = rank
        self._next_boundary = next_boundary
        self._late = late
        self._last_pause = 0

    def poll(self) -> list[ControlRequest | Refused]:
        out: list[ControlRequest | Refused] = []
        for got in self.reader.poll():
            if isinstance(got, ControlRequest):
                got = self._prepare(got)
            out.append(got)
        return out

    def _prepare(self, got: ControlRequest) -> ControlRequest:
        at_step = got.at_step
        named = isinstance(at_step, int) and not isinstance(at_step, bool) and at_step >= 0
        if got.kind == "pause" and named:
            self._last_pause = max(self._last_pause, at_step)  # type: ignore[call-overload]
        if got.kind == "resume":
            # Never before the pause it follows: a rank that has not paused yet pauses, then
            # resumes, at that step; one paused there resumes at once.
            at_step = max(at_step if named else 0, self._last_pause)  # type: ignore[call-overload]
        elif not named:
            return got  # refused by the steering, with its reason
        now = self._next_boundary()
        if at_step < now and got.kind != "resume" and self._late is not None:  # type: ignore[operator]
            self._late(got.file, int(at_step), now)  # type: ignore[call-overload]
        value = got.value
        if got.kind == "checkpoint" and isinstance(value, str) and value:
            path = pathlib.PurePath(value)
            value = str(path.with_name(f"{path.stem}-rank{self.rank}{path.suffix}"))
        source = f"job/{got.source}"[:40]
        return dataclasses.replace(got, value=value, source=source, at_step=at_step)


__all__ = [
    "AHEAD_TICKS",
    "MIN_AHEAD",
    "SLACK_S",
    "JobReader",
    "Position",
    "at_step_for",
    "job_position",
    "rate_of",
    "send_job",
    "send_to",
    "steps_ahead",
    "write_job_request",
]
