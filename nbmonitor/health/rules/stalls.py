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

All ranks at the same place (a long evaluation, a checkpoint, every rank slow) name no rank.
Subject: the rank (``rank1``); the message names its host, last step, phase and process id.
"""

from __future__ import annotations

import math

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.rule import Base, Outcome, always, nothing
from nbmonitor.health.view import RankColumns, RankProgress, View
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


def _where(step: float, phase: float) -> str:
    """``in the backward pass of step 58`` (the step in progress: one after those done)."""
    if not math.isfinite(step):
        return "before its first sample"
    name = _phase(phase)
    if name not in _PLACES:
        return f"after step {step:.0f}"
    return _PLACES[name].format(f"{step + 1:.0f}")


def stall_limit(ranks: RankColumns, stall_s: float) -> float:
    """Seconds without a completed step before a rank is named."""
    times = ranks.step_time[np.isfinite(ranks.step_time)]
    typical = float(np.median(times)) if times.size else 0.0
    return max(stall_s, STALL_STEP_TIMES * typical)


def stalled(ranks: RankColumns, stall_s: float) -> dict[int, tuple[str, str]]:
    """Rank -> (severity, why it is named: the end of the alert's first sentence), for each
    rank that holds the job up now (see the module docstring). A rank frozen, dead or gone is
    an error; one behind the others a warning (a checkpoint or an evaluation on one rank
    alone looks the same while it lasts)."""
    p = ranks.progress
    if p is None or len(ranks.ranks) < 2:
        return {}
    seen, step, phase = p.seen, p.step, p.phase
    ends = p.step_end[np.isfinite(p.step_end)]
    if not math.isfinite(p.now) or not ends.size:
        return {}
    limit = stall_limit(ranks, stall_s)
    idle = p.now - float(ends.max())
    if idle < limit:
        return {}
    ended = np.array(p.ended, dtype=bool)
    silent = ~ended & (~np.isfinite(seen) | (p.now - seen >= limit))
    live = ~ended & ~silent
    if not live.any():
        return {}  # nobody is left waiting (the job is over, or nothing is written at all)
    waiting = _others(ranks, p, live)
    found: dict[int, tuple[str, str]] = {}
    for i in np.flatnonzero(silent):
        found[ranks.ranks[i]] = (
            "error",
            (
                f"has written nothing for {p.now - seen[i]:.0f} s (its last sample: "
                f"{_where(step[i], phase[i])}) while {waiting}: its process is frozen or dead "
                "(killed, out of memory? see its log)"
            ),
        )
    if found:
        return found
    in_step = live & np.isin(phase, list(_IN_STEP))
    if ended.any() and in_step.any():
        for i in np.flatnonzero(ended):
            found[ranks.ranks[i]] = (
                "error",
                (
                    f"has ended its run ({p.status[i]}) after step {step[i]:.0f} while "
                    f"{_others(ranks, p, live)}: it left the job (an exception on that rank "
                    "alone, or a loop that ran fewer steps there)"
                ),
            )
        return found
    position = np.where(np.isfinite(phase), step + (np.nan_to_num(phase) + 1) / 10, step)
    position = np.where(live & np.isfinite(step), position, math.nan)
    if np.isfinite(position).sum() < 2:
        return {}
    behind = float(np.nanmin(position))
    if behind >= float(np.nanmax(position)):
        return {}  # every rank at the same place: no one to name
    lagging = live & (position == behind)
    ahead = live & ~lagging
    waiting = _others(ranks, p, ahead)
    for i in np.flatnonzero(lagging):
        found[ranks.ranks[i]] = (
            "warning",
            (
                f"has made no progress for {idle:.0f} s: its last completed step is "
                f"{step[i]:.0f}, and it is {_where(step[i], phase[i])}, while {waiting}"
            ),
        )
    return found


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


class RankStalled(Base):
    """A rank that holds up a distributed job: stopped, frozen, gone, or behind the others."""

    name = "rank_stalled"

    def check(self, view: View) -> Outcome:
        ranks = view.inp.ranks
        if ranks is None or ranks.progress is None or len(ranks.ranks) < 2:
            return nothing(self.name)
        found = stalled(ranks, self.thresholds.stall_s)
        hosts = dict(zip(ranks.ranks, ranks.hosts, strict=False))
        pids = dict(zip(ranks.ranks, ranks.progress.pids, strict=False))

        def make(new: list[str]) -> list[Alert]:
            alerts = []
            for subject in new:
                rank = int(subject.removeprefix("rank"))
                host, pid = hosts.get(rank, "?"), pids.get(rank)
                look = (
                    f"`py-spy dump --pid {pid}` on {host} shows where it is"
                    if pid is not None
                    else f"a stack dump of it on {host} (py-spy dump) shows where it is"
                )
                i = ranks.ranks.index(rank)
                last = ranks.progress.step[i] if ranks.progress is not None else math.nan
                severity, why = found[rank]
                alerts.append(
                    Alert(
                        self.name,
                        severity,
                        f"Rank {rank} on {host} is stalling the job: it {why}. {look}; "
                        "a checkpoint or an evaluation run on one rank alone shows like this "
                        "too, for as long as it lasts.",
                        int(last) if math.isfinite(last) else view.inp.step,
                        view.inp.time,
                        subject=subjects.rank(rank),
                    )
                )
            return alerts

        held = [subjects.rank(r) for r in found]
        return Outcome(self.name, held, always, make)


__all__ = ["STALL_STEP_TIMES", "RankStalled", "stall_limit", "stalled"]
