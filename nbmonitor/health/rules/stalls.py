"""A stalled rank: one rank of a distributed job stops making progress while the others wait
for it (a collective hang, a rank stuck in its data loader or frozen, a dead process).

Judged over ``HealthInput.ranks.progress``: where each rank is now, as its own files say. Every
rank's sampler writes a system sample each interval, with the steps completed and the step
phase its training thread is in (``phase``), even while that thread is blocked; so the ranks
that wait show where they wait (in a synchronous job, ``backward``: DDP's gradient all-reduce),
and the rank they wait for shows where it is, or stops writing at all.

The rule holds once no rank has completed a step for ``Thresholds.stall_s`` seconds (and for
``STALL_STEP_TIMES`` median step times, so that slow steps are not a stall), for:

* a rank that has written nothing for that long while others still write: its process is
  frozen or dead;
* else a rank that has ended its run while the others wait inside a step;
* else the ranks furthest behind (fewest steps completed, then earliest phase of the step)
  when the others are further: the others wait for them.

* else, every rank at the same place (the same step and phase): the job is stalled as a
  whole, at that place (every rank waits for a data source that hangs, or for a collective
  that never completes; a long evaluation or checkpoint on every rank looks the same while it
  lasts, so it is a warning that says so).

How long a rank has been silent is counted from the newest thing known of it: its newest
system sample, else the end of its newest step (a rank frozen before its sampler wrote), else
its run's start, else the job's (the earliest rank's start).

Subject: the rank (``rank1``), or the run as a whole for a job stalled at one place; the
message names the rank(s), host(s), last step, phase and process id(s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import FINDING, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, nothing
from nbmonitor.health.view import HealthView, RankColumns, RankProgress
from nbmonitor.health.window import BoolArray, FloatArray
from nbmonitor.records import PHASES

STALL_STEP_TIMES = 5  # ... and no step for this many median step times
# The phases a waiting rank sits in while the job is inside a step (not between steps).
_IN_STEP = {PHASES.index("forward"), PHASES.index("backward"), PHASES.index("optimizer")}


# Where a rank is in a step, by phase (``{}``: the step in progress).
_PLACES = {
    "data": "in the data phase of step {} (before its forward pass: loading its batch)",
    "forward": "in the forward pass of step {}",
    "backward": "in the backward pass of step {}",
    # After the backward pass's last gradient: DDP's all-reduce wait ends the pass here.
    "other": "at the end of the backward pass of step {}",
    "optimizer": "in the optimizer step of step {}",
}


def _phase(code: float) -> str:
    return PHASES[int(code)] if math.isfinite(code) and 0 <= code < len(PHASES) else "unknown"


def _where(step: float, phase: float, short: bool = False) -> str:
    """``in the backward pass of step 58`` (the step in progress: one after those done);
    ``short``: without what the phase holds."""
    if not math.isfinite(step):
        return "before its first step"
    name = _phase(phase)
    if name not in _PLACES:
        return f"after step {step:.0f}"
    place = _PLACES[name].format(f"{step + 1:.0f}")
    return place.split(" (", 1)[0] if short else place


def stall_limit(ranks: RankColumns, stall_s: float) -> float:
    """Seconds without a completed step before a rank is named."""
    times = ranks.step_time[np.isfinite(ranks.step_time)]
    typical = float(np.median(times)) if times.size else 0.0
    return max(stall_s, STALL_STEP_TIMES * typical)


@dataclass(frozen=True)
class _Now:
    """Where the job is now: how long no rank has completed a step, and which ranks have
    ended, write nothing, or still write."""

    idle: float  # seconds since the newest step of any rank ended
    limit: float  # seconds without a step before anything is named
    ended: BoolArray
    silent: BoolArray
    live: BoolArray


def _now(ranks: RankColumns, stall_s: float) -> _Now | None:
    """The job's state when no rank has completed a step for the limit (else None)."""
    p = ranks.progress
    if p is None or len(ranks.ranks) < 2:
        return None
    ends = p.step_end[np.isfinite(p.step_end)]
    if not math.isfinite(p.now) or not ends.size:
        return None
    limit = stall_limit(ranks, stall_s)
    idle = p.now - float(ends.max())
    if idle < limit:
        return None
    ended = np.array(p.ended, dtype=bool)
    heard = np.array([_heard(p, i)[0] for i in range(len(ranks.ranks))])
    silent = ~ended & ~(p.now - heard < limit)  # NaN (nothing known at all): silent
    return _Now(idle, limit, ended, silent, ~ended & ~silent)


def _heard(p: RankProgress, i: int) -> tuple[float, str]:
    """When rank ``i`` was last heard of, and what that was (see the module docstring)."""
    if math.isfinite(p.seen[i]):
        return float(p.seen[i]), f"its last sample: {_where(p.step[i], p.phase[i])}"
    if math.isfinite(p.step_end[i]):
        return float(p.step_end[i]), f"its last record: the end of step {p.step[i]:.0f}"
    started = p.started if p.started is not None else np.empty(0)
    if started.size > i and math.isfinite(started[i]):
        return float(started[i]), "since its run started: no step, no sample"
    known = started[np.isfinite(started)]
    if known.size:
        return float(known.min()), "since the job started: no step, no sample"
    return math.nan, "no step, no sample"


def _silence(p: RankProgress, i: int, idle: float) -> tuple[float, str]:
    """(seconds, ``12 s (its last sample: ...)``): never NaN; at least the job's idle time
    when nothing of the rank is known at all."""
    when, what = _heard(p, i)
    if not math.isfinite(when):
        return idle, f"at least {idle:.0f} s ({what})"
    seconds = max(p.now - when, 0.0)
    return seconds, f"{seconds:.0f} s ({what})"


@dataclass(frozen=True)
class Stall:
    """Why one rank is named: ``cause`` what holds the job up, ``said`` the evidence in words
    (how long, where it is, where the others wait), ``evidence`` the same as data."""

    severity: str
    cause: str
    said: str
    evidence: dict[str, object]


def _position(p: RankProgress, live: BoolArray) -> FloatArray:
    """Each live rank's place in the job: steps done, then the phase of the step in progress
    (NaN for the others)."""
    step, phase = p.step, p.phase
    position = np.where(np.isfinite(phase), step + (np.nan_to_num(phase) + 1) / 10, step)
    return np.where(live & np.isfinite(step), position, math.nan)


def _evidence(ranks: RankColumns, p: RankProgress, i: int, **more: object) -> dict[str, object]:
    return {
        "rank": ranks.ranks[i],
        "host": ranks.hosts[i] if i < len(ranks.hosts) else "?",
        "pid": p.pids[i] if i < len(p.pids) else None,
        "steps_done": float(p.step[i]),
        "phase": _phase(p.phase[i]),
        **more,
    }


def stalled(ranks: RankColumns, stall_s: float) -> dict[int, Stall]:
    """Rank -> why it is named, for each rank that holds the job up now (see the module
    docstring). A rank frozen, dead or gone is an error; one behind the others a warning (a
    checkpoint or an evaluation on one rank alone looks the same while it lasts)."""
    now = _now(ranks, stall_s)
    p = ranks.progress
    if now is None or p is None or not now.live.any():
        return {}  # nobody is left waiting (the job is over, or nothing is written at all)
    step, phase, live, ended = p.step, p.phase, now.live, now.ended
    waiting = _others(ranks, p, live)
    found: dict[int, Stall] = {}
    for i in np.flatnonzero(now.silent):
        seconds, silence = _silence(p, int(i), now.idle)
        found[ranks.ranks[i]] = Stall(
            "error",
            "its process is frozen or dead: stopped, killed or out of memory",
            f"it has written nothing for {silence} while {waiting}",
            _evidence(ranks, p, int(i), silent_s=seconds, waiting=waiting),
        )
    if found:
        return found
    in_step = live & np.isin(phase, list(_IN_STEP))
    if ended.any() and in_step.any():
        waiting = _others(ranks, p, live)
        for i in np.flatnonzero(ended):
            found[ranks.ranks[i]] = Stall(
                "error",
                "it left the job: an exception on that rank alone, or a loop that ran fewer "
                "steps there",
                f"it ended its run ({p.status[i]}) after step {step[i]:.0f} while {waiting}",
                _evidence(ranks, p, int(i), status=p.status[i], waiting=waiting),
            )
        return found
    position = _position(p, live)
    if np.isfinite(position).sum() < 2:
        return {}
    behind = float(np.nanmin(position))
    if behind >= float(np.nanmax(position)):
        return {}  # every rank at the same place: the job as a whole (stuck_together)
    lagging = live & (position == behind)
    waiting = _others(ranks, p, live & ~lagging)
    for i in np.flatnonzero(lagging):
        found[ranks.ranks[i]] = Stall(
            "warning",
            "it is behind the others, and they wait for it",
            f"it has made no progress for {now.idle:.0f} s: its last completed step is "
            f"{step[i]:.0f}, and it is {_where(step[i], phase[i])}, while {waiting}",
            _evidence(ranks, p, int(i), idle_s=now.idle, waiting=waiting),
        )
    return found


def stuck_together(ranks: RankColumns, stall_s: float) -> tuple[int, float, float] | None:
    """(the phase every rank is in, the steps every rank has completed, seconds without a
    step) when no rank has completed a step for the limit and every rank is still running, at
    the same place (see the module docstring); else None."""
    now = _now(ranks, stall_s)
    p = ranks.progress
    if now is None or p is None or not now.live.all():
        return None  # a rank silent or gone: stalled() names it
    position = _position(p, now.live)
    if not np.isfinite(position).all() or float(np.ptp(position)) > 0:
        return None
    phase = float(p.phase[0])
    return (int(phase) if math.isfinite(phase) else -1), float(p.step[0]), now.idle


def _others(ranks: RankColumns, p: RankProgress, which: np.ndarray) -> str:
    """``the other ranks wait in the backward phase of step 58``, from where ``which`` are."""
    index = np.flatnonzero(which)
    if not index.size:
        return "the other ranks wait"
    places = sorted({_where(p.step[i], p.phase[i]) for i in index})
    who = "the other ranks wait" if len(index) > 1 else f"rank {ranks.ranks[index[0]]} waits"
    hint = ""
    if any(_phase(p.phase[i]) in ("backward", "other") for i in index):
        hint = " (where DDP's gradient all-reduce waits for every rank)"
    return f"{who} {' or '.join(places)}{hint}"


# Why every rank would stop at the same place, by phase, and what to do.
_TOGETHER = {
    "data": (
        "every rank waits for its next batch from a data source that hangs for all (a "
        "network filesystem, a DataLoader worker that died), or runs the same work between "
        "steps (an evaluation or a checkpoint, which ends by itself)",
        "num_workers=0 shows a worker's error",
    ),
    "collective": (
        "every rank waits in a collective that does not complete (DDP's gradient all-reduce, "
        "or one of your own): a rank of the group that writes no files here, or a network "
        "failure between hosts",
        "set NCCL_DEBUG=INFO, and a timeout= in init_process_group so that a hang raises",
    ),
}


def _job_stall(ranks: RankColumns, phase: int, step: float, idle: float, time: float) -> Alert:
    """The alert of a job stalled as a whole."""
    p = ranks.progress
    pids = p.pids if p is not None else ()
    hosts = " and ".join(sorted(set(ranks.hosts)))
    who = ", ".join(str(r) for r in ranks.ranks[:-1]) + f" and {ranks.ranks[-1]}"
    name = _phase(float(phase))
    why, fix = _TOGETHER["data" if name == "data" else "collective"]
    dumps = ", ".join(
        f"--pid {pid} (rank {r})" for r, pid in zip(ranks.ranks, pids, strict=False) if pid
    )
    look = f"`py-spy dump` on {hosts} ({dumps})" if dumps else f"`py-spy dump` on {hosts}"
    return cause_alert(
        RankStalled.name,
        cause=f"The job is stalled: {why}",
        said=f"ranks {who} on {hosts} have made no progress for {idle:.0f} s, every one "
        f"{_where(step, float(phase), short=True)}",
        evidence={
            "ranks": list(ranks.ranks),
            "hosts": sorted(set(ranks.hosts)),
            "pids": list(pids),
            "idle_s": idle,
            "steps_done": step,
            "phase": name,
        },
        fix=f"{look} shows where each waits; {fix}",
        place=f"step {step + 1:.0f}, {name} phase, every rank",
        step=int(step),
        time=time,
        subject=subjects.RUN,
    )


class RankStalled(Base):
    """A rank that holds up a distributed job (stopped, frozen, gone, or behind the others),
    or the whole job stopped at one place."""

    name = "rank_stalled"
    doc = RuleDoc(
        FINDING,
        "a rank (or the whole job) is frozen, dead or stuck while the others wait",
        "no step completed for `stall_s` (30 s) and 5 median step times, with where each rank is",
        "`py-spy dump --pid PID` on its host; its log says why it stopped",
        (),
    )

    def check(self, view: HealthView) -> Outcome:
        ranks = view.inp.ranks
        if ranks is None or ranks.progress is None or len(ranks.ranks) < 2:
            return nothing(self.name)
        found = stalled(ranks, self.thresholds.stall_s)
        together = None if found else stuck_together(ranks, self.thresholds.stall_s)
        hosts = dict(zip(ranks.ranks, ranks.hosts, strict=False))
        pids = dict(zip(ranks.ranks, ranks.progress.pids, strict=False))

        def make(new: list[str]) -> list[Alert]:
            alerts = []
            for subject in new:
                if subject == subjects.RUN and together is not None:
                    alerts.append(_job_stall(ranks, *together, view.inp.time))
                    continue
                rank = int(subject.removeprefix("rank"))
                host, pid = hosts.get(rank, "?"), pids.get(rank)
                look = (
                    f"`py-spy dump --pid {pid}` on {host} shows where it is"
                    if pid is not None
                    else f"a stack dump of it on {host} (py-spy dump) shows where it is"
                )
                i = ranks.ranks.index(rank)
                last = ranks.progress.step[i] if ranks.progress is not None else math.nan
                stall = found[rank]
                if stall.severity == "error":
                    look += "; its log says why it stopped"
                else:
                    look += (
                        "; a checkpoint or an evaluation run on that rank alone shows like "
                        "this too, for as long as it lasts"
                    )
                alerts.append(
                    cause_alert(
                        self.name,
                        cause=f"Rank {rank} on {host} is stalling the job: {stall.cause}",
                        said=stall.said,
                        evidence=stall.evidence,
                        fix=look,
                        place=f"rank {rank} on {host}",
                        step=int(last) if math.isfinite(last) else view.inp.step,
                        time=view.inp.time,
                        subject=subjects.rank(rank),
                        severity=stall.severity,
                    )
                )
            return alerts

        held = [subjects.rank(r) for r in found]
        if together is not None:
            held.append(subjects.RUN)
        return Outcome(self.name, held, always, make)


__all__ = ["STALL_STEP_TIMES", "RankStalled", "Stall", "stall_limit", "stalled", "stuck_together"]
