"""Ranks training on the same batches: in a data-parallel job every rank should see its own
shard of the data; ranks that all load the whole dataset in the same order (a ``DataLoader``
without a ``DistributedSampler``), or draw their batches from generators seeded alike, compute
the same loss on every step, since DDP keeps their weights identical. The job then does the
work of one rank at the cost of all of them.

Judged over ``HealthInput.ranks.loss`` (each rank's own loss per step, from its files): ranks
whose losses agree to ``EQUAL_TOLERANCE`` (relative) on each of the last ``SAME_STEPS`` or more
steps they all recorded (at most ``WINDOW``), while the loss itself moves over those steps (a
loss stuck at one value, ln(vocabulary) from a collapsed model say, would agree on any data).
Batches of different data differ in their loss far above that tolerance: two means of a
million tokens each still differ by about 1e-3 of their value. Subject: the group's lowest
rank (``rank0``); the message names every rank of the group.
"""

from __future__ import annotations

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, nothing
from nbmonitor.health.view import HealthView, RankColumns
from nbmonitor.health.window import FloatArray

WINDOW = 50  # newest steps every rank recorded
SAME_STEPS = 10  # judged with at least this many
EQUAL_TOLERANCE = 1e-5  # relative difference of two ranks' losses that counts as equal


def _recent(ranks: RankColumns) -> tuple[FloatArray, FloatArray]:
    """The losses of the last WINDOW steps where every rank has a finite one, and the steps."""
    loss = ranks.loss
    if loss is None or loss.shape != ranks.step_time.shape:
        return np.empty(0), np.empty((len(ranks.ranks), 0))
    index = np.flatnonzero(np.isfinite(loss).all(axis=0))[-WINDOW:]
    return ranks.steps[index], loss[:, index]


def same_batches(ranks: RankColumns) -> list[tuple[int, ...]]:
    """Groups of two or more ranks whose losses are equal step after step, lowest rank first."""
    if len(ranks.ranks) < 2:
        return []
    _, loss = _recent(ranks)
    if loss.shape[1] < SAME_STEPS:
        return []
    scale = np.maximum(np.abs(loss), 1e-12)
    moving = float(np.ptp(loss[0])) > EQUAL_TOLERANCE * float(np.median(scale[0])) * 10
    if not moving:
        return []  # a loss that does not move agrees on any data
    groups: list[tuple[int, ...]] = []
    placed: set[int] = set()
    for i in range(len(ranks.ranks)):
        if i in placed:
            continue
        rel = np.abs(loss - loss[i]) / np.maximum(scale, scale[i])
        group = [j for j in range(len(ranks.ranks)) if (rel[j] <= EQUAL_TOLERANCE).all()]
        if len(group) > 1:
            placed.update(group)
            groups.append(tuple(ranks.ranks[j] for j in group))
    return groups


def _names(group: tuple[int, ...]) -> str:
    head = ", ".join(str(r) for r in group[:-1])
    return f"Ranks {head} and {group[-1]}"


class SameBatches(Base):
    """Ranks whose losses are equal step after step: they train on the same batches."""

    name = "same_batches"
    doc = RuleDoc(
        CAUSE,
        "ranks train on the same batches: a `DataLoader` without a `DistributedSampler`",
        "the ranks' losses equal (to 1e-5) on each of the last 10 to 50 steps while the loss moved",
        "`DataLoader(dataset, sampler=DistributedSampler(dataset))` and `sampler.set_epoch(epoch)`",
        ("a healthy sharded job",),
    )

    def check(self, view: HealthView) -> Outcome:
        ranks = view.inp.ranks
        if ranks is None or ranks.loss is None or len(ranks.ranks) < 2:
            return nothing(self.name)
        groups = {subjects.rank(g[0]): g for g in same_batches(ranks)}
        steps, _ = _recent(ranks)

        def make(new: list[str]) -> list[Alert]:
            alerts = []
            for subject in new:
                group = groups[subject]
                everyone = len(group) == len(ranks.ranks)
                hosts = dict(zip(ranks.ranks, ranks.hosts, strict=False))
                on = " and ".join(sorted({hosts.get(r, "?") for r in group}))
                alerts.append(
                    cause_alert(
                        self.name,
                        cause=f"{_names(group)} on {on} are training on the same batches (a "
                        "DataLoader without a DistributedSampler, or every rank's data "
                        f"seeded alike), so {'the job' if everyone else 'these ranks'} "
                        f"{'does' if everyone else 'do'} the work of one rank",
                        said=f"they have had the same loss on each of the last {steps.size} steps",
                        evidence={
                            "ranks": list(group),
                            "hosts": [hosts.get(r, "?") for r in group],
                            "equal_steps": int(steps.size),
                        },
                        fix="give each rank its own shard of the data: DataLoader(dataset, "
                        "sampler=DistributedSampler(dataset)) with sampler.set_epoch(epoch) "
                        "every epoch, or, for data drawn at random, a generator seeded with "
                        "seed + rank (a loss averaged across ranks before it is logged is "
                        "equal too: log each rank's own)",
                        place=_names(group).lower(),
                        step=int(steps[-1]),
                        time=view.inp.time,
                        subject=subject,
                    )
                )
            return alerts

        return Outcome(self.name, list(groups), always, make)


__all__ = ["EQUAL_TOLERANCE", "SAME_STEPS", "WINDOW", "SameBatches", "same_batches"]
