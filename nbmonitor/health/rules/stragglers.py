"""Stragglers: one rank of a distributed job that the others keep waiting for.

Judged over ``HealthInput.ranks`` (every rank's per-step columns, read from the job's per-rank
streams, never gathered with a collective). Two signals, the first that holds names the rank:

* ``phase_data_s`` (the step's data phase, from the previous step's end to its first forward;
  measured with the step phases, on by default): in a
  synchronous job (DDP) every rank's step takes as long as the slowest one, because they all
  meet in the gradient all-reduce, so step times agree; the straggler is the rank that comes
  late to that meeting, by waiting longer for its batch;
* ``step_time``: ranks that do not synchronise every step (independent workers, a broken
  process group) show the straggler directly.

A rank holds in a window of ``WINDOW`` steps that every rank recorded when its value exceeds
the median of the other ranks by at least ``EXCESS_FRACTION`` of the median step time (it costs
the job that share of every step), and it is the largest on at least ``SLOWEST_SHARE`` of
those steps. As the time rules' verdicts (``time.PERSIST_STEPS``), it must persist: it holds in
the window ending at the newest step and in those ending every ``PERSIST_STRIDE`` steps before
it, back ``PERSIST_STEPS`` steps, so that one slow interval of one rank (a checkpoint, a busy
neighbour for a second) is not a straggler. Judged on the ranks' columns themselves, the verdict
is the same live, checked every few seconds, and read from disk in one check. Subject: the
rank (``rank1``); the message names its host.
"""

from __future__ import annotations

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import FINDING, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, nothing
from nbmonitor.health.rules.time import PERSIST_STEPS
from nbmonitor.health.view import HealthView, RankColumns
from nbmonitor.health.window import FloatArray

WINDOW = 50  # steps every rank recorded, newest
MIN_STEPS = 10  # a window is judged only with this many
EXCESS_FRACTION = 0.1  # the rank's extra time, as a fraction of the median step time
SLOWEST_SHARE = 0.75  # ... and the slowest rank on this share of the steps
PERSIST_STRIDE = 25  # the windows judged end this many steps apart, back PERSIST_STEPS
# The rule so reads the last PERSIST_STEPS + WINDOW (150) steps: the job reader and the display
# rank's follower hand it 4 * WINDOW (job_report.py, live/ranks.py).

_WHAT = {
    "phase_data_s": "wait for its next batch (phase_data_s)",
    "step_time": "step time",
}


def _holding(values: FloatArray, times: FloatArray) -> dict[int, tuple[float, float]]:
    """Row -> (median excess in seconds, share of steps it was slowest) for each row that
    holds in this window."""
    floor = EXCESS_FRACTION * float(np.median(times))
    slowest = values.argmax(axis=0)
    out: dict[int, tuple[float, float]] = {}
    for i in range(values.shape[0]):
        others = np.median(np.delete(values, i, axis=0), axis=0)
        excess = float(np.median(values[i] - others))
        share = float(np.mean(slowest == i))
        if excess > 0 and excess >= floor and share >= SLOWEST_SHARE:
            out[i] = (excess, share)
    return out


def stragglers(ranks: RankColumns) -> dict[int, tuple[str, float, float, int, float]]:
    """Rank -> (metric, median excess in seconds, share of steps it was slowest, steps
    judged, newest step judged), from the newest window, for each rank that holds in every
    window back ``PERSIST_STEPS`` steps."""
    found: dict[int, tuple[str, float, float, int, float]] = {}
    if len(ranks.ranks) < 2:
        return found
    signals = [("phase_data_s", ranks.data_wait), ("step_time", ranks.step_time)]
    for metric, matrix in signals:
        if matrix is None or matrix.shape != ranks.step_time.shape:
            continue
        # The steps where every rank has both a value and a step time.
        ok = np.isfinite(matrix).all(axis=0) & np.isfinite(ranks.step_time).all(axis=0)
        index = np.flatnonzero(ok)
        if index.size < PERSIST_STEPS + MIN_STEPS:
            continue
        windows = []
        for end in range(index.size, index.size - PERSIST_STEPS - 1, -PERSIST_STRIDE):
            cols = index[max(0, end - WINDOW) : end]
            windows.append(_holding(matrix[:, cols], ranks.step_time[:, cols]))
        newest = windows[0]
        n, last = min(WINDOW, index.size), float(ranks.steps[index[-1]])
        for i, rank in enumerate(ranks.ranks):
            if rank not in found and all(i in w for w in windows):
                found[rank] = (metric, *newest[i], n, last)
    return found


class Stragglers(Base):
    """A rank whose step time or data wait is consistently above the other ranks'."""

    name = "straggler"
    doc = RuleDoc(
        FINDING,
        "one rank comes late to every step's all-reduce",
        "its data wait (or step time) above the other ranks' median on most of the last 50 steps, "
        "held over 100 steps",
        "check its `DataLoader` workers, its GPU's clocks and other load on its host",
        ("a busy neighbour for a moment",),
    )

    def check(self, view: HealthView) -> Outcome:
        ranks = view.inp.ranks
        if ranks is None or len(ranks.ranks) < 2 or not ranks.steps.size:
            return nothing(self.name)
        found = stragglers(ranks)
        hosts = dict(zip(ranks.ranks, ranks.hosts, strict=False))

        def make(new: list[str]) -> list[Alert]:
            alerts = []
            for subject in new:
                rank = int(subject.removeprefix("rank"))
                metric, excess, share, n, last = found[rank]
                host = hosts.get(rank, "?")
                alerts.append(
                    cause_alert(
                        self.name,
                        cause=f"Rank {rank} on {host} is a straggler: every rank waits for it",
                        said=f"its {_WHAT[metric]} is {excess * 1e3:.0f} ms above the other "
                        f"ranks' and it was the slowest on {share:.0%} of the last {n} steps, "
                        f"and so for over {PERSIST_STEPS} steps",
                        evidence={
                            "rank": rank,
                            "host": host,
                            "metric": metric,
                            "excess_s": excess,
                            "slowest_share": share,
                            "of_steps": n,
                        },
                        fix=f"check its input pipeline (DataLoader workers), its GPU (clocks, "
                        f"temperature) and other load on {host}",
                        place=f"rank {rank} on {host}",
                        step=int(last),
                        time=view.inp.time,
                        subject=subjects.rank(rank),
                    )
                )
            return alerts

        held = [subjects.rank(r) for r in found]
        return Outcome(self.name, held, always, make)


__all__ = [
    "EXCESS_FRACTION",
    "MIN_STEPS",
    "PERSIST_STRIDE",
    "SLOWEST_SHARE",
    "WINDOW",
    "Stragglers",
    "stragglers",
]
