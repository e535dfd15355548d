"""Ranks out of sync: in a data-parallel job (DDP) every rank applies the same gradients, the
average the all-reduce made, so the ranks' ``grad_norm`` agree to rounding on every step and
their models stay identical; their losses, each of its own batch, stay close.

Judged over ``HealthInput.ranks`` (each rank's own ``grad_norm`` and loss per step, from its
files), on the newest ``WINDOW`` steps every rank recorded:

* a rank whose ``grad_norm`` differs from the median of every rank by more than
  ``GRAD_TOLERANCE`` (relative) on more than half of those steps (at least ``GRAD_STEPS``):
  its gradients were not averaged with the others' (every backward under DDP's ``no_sync()``,
  a model not wrapped in ``DistributedDataParallel``, a rank in another process group). With
  two ranks, or when no majority agrees, every rank differs alike: they are named together;
* a rank whose median loss over those steps (at least ``LOSS_STEPS``) is more than
  ``LOSS_TOLERANCE`` (relative) from the others': it trains on other data or another state;
* a rank whose value is infinite where another rank's is finite, at once.

The median of every rank is the reference, so a majority that agrees outvotes the rank that
does not. Subject: the rank (``rank2``), or the group's lowest rank; the message names every
rank named, its host, the steps judged and by how much they differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, nothing
from nbmonitor.health.view import HealthView, RankColumns
from nbmonitor.health.window import FloatArray

WINDOW = 50  # newest steps every rank recorded
GRAD_TOLERANCE = 1e-3  # relative difference of all-reduced grad norms: rounding only
GRAD_STEPS = 5  # grad norms judged with at least this many steps
LOSS_TOLERANCE = 0.5  # relative difference of a rank's median loss from the others'
LOSS_STEPS = 10  # losses judged with at least this many steps


@dataclass(frozen=True)
class Finding:
    """What one rank (or a group of ranks that differ alike) disagrees on."""

    ranks: tuple[int, ...]
    metric: str  # "grad_norm" | "loss"
    step: float  # the newest step it was seen on
    what: str  # the evidence, in words
    evidence: dict[str, object]  # the same, as data


def _matrix(ranks: RankColumns, metric: str) -> FloatArray | None:
    values = ranks.grad_norm if metric == "grad_norm" else ranks.loss
    return values if values is not None and values.shape == ranks.step_time.shape else None


def _infinite(ranks: RankColumns, metric: str, values: FloatArray) -> list[Finding]:
    """Ranks whose value is infinite on a step where another rank's is finite."""
    found = []
    finite = np.isfinite(values)
    for i, rank in enumerate(ranks.ranks):
        bad = np.isinf(values[i]) & np.delete(finite, i, axis=0).any(axis=0)
        if bad.any():
            step = float(ranks.steps[np.flatnonzero(bad)[0]])
            what = f"its {metric} is infinite at step {step:.0f} while other ranks' is finite"
            found.append(Finding((rank,), metric, step, what, {"infinite_at_step": step}))
    return found


def _grad_norms(ranks: RankColumns, values: FloatArray) -> list[Finding]:
    common = np.flatnonzero(np.isfinite(values).all(axis=0))[-WINDOW:]
    if common.size < GRAD_STEPS:
        return []
    window = values[:, common]
    reference = np.median(window, axis=0)
    rel = np.abs(window - reference) / np.maximum(np.abs(reference), 1e-30)
    off = rel > GRAD_TOLERANCE
    named = [i for i in range(len(ranks.ranks)) if off[i].sum() * 2 > common.size]
    if not named:
        return []
    step = float(ranks.steps[common[-1]])

    def finding(rows: list[int]) -> Finding:
        worst = float(rel[rows].max())
        steps = int(off[rows].any(axis=0).sum())
        what = (
            f"grad norms that differ on {steps} of the last {common.size} steps (by up to "
            f"{worst:.1%}), where DDP's all-reduce makes them equal to rounding"
        )
        data: dict[str, object] = {
            "steps_off": steps,
            "of_steps": int(common.size),
            "max_relative_difference": worst,
            "newest": [float(v) for v in window[rows, -1]],
        }
        return Finding(tuple(ranks.ranks[i] for i in rows), "grad_norm", step, what, data)

    if len(named) == len(ranks.ranks):  # no majority agrees: the job as a whole
        return [finding(named)]
    return [finding([i]) for i in named]


def _losses(ranks: RankColumns, values: FloatArray) -> list[Finding]:
    common = np.flatnonzero(np.isfinite(values).all(axis=0))[-WINDOW:]
    if common.size < LOSS_STEPS:
        return []
    mine = np.median(values[:, common], axis=1)
    theirs = float(np.median(np.median(values[:, common], axis=0)))
    far = np.abs(mine - theirs) > LOSS_TOLERANCE * max(abs(theirs), 1e-12)
    named = np.flatnonzero(far)
    step = float(ranks.steps[common[-1]])

    def finding(i: int) -> Finding:
        what = (
            f"a loss far from the other ranks' (its median {mine[i]:.4g} over the last "
            f"{common.size} steps, theirs {theirs:.4g})"
        )
        data: dict[str, object] = {"median": float(mine[i]), "others_median": theirs}
        data["of_steps"] = int(common.size)
        return Finding((ranks.ranks[i],), "loss", step, what, data)

    return [finding(int(i)) for i in named]


def out_of_sync(ranks: RankColumns) -> list[Finding]:
    """What the ranks disagree on (see the module docstring), grad norms first."""
    if len(ranks.ranks) < 2:
        return []
    found: list[Finding] = []
    for metric, judge in (("grad_norm", _grad_norms), ("loss", _losses)):
        values = _matrix(ranks, metric)
        if values is None:
            continue
        infinite = _infinite(ranks, metric, values)
        found += infinite or judge(ranks, values)
    return found


def _names(group: tuple[int, ...]) -> str:
    if len(group) == 1:
        return f"Rank {group[0]}"
    return "Ranks " + ", ".join(str(r) for r in group[:-1]) + f" and {group[-1]}"


_GRAD_CAUSE = (
    "the gradients are not averaged across ranks, so each rank's model drifts away from the "
    "others' (every backward under DDP's no_sync(), a model not wrapped in "
    "DistributedDataParallel, or ranks in different process groups)"
)
_GRAD_FIX = (
    "run the backward of each step's last micro-batch outside no_sync(), so that DDP "
    "all-reduces it before optimizer.step() (a sharded model, FSDP or ZeRO, reports each "
    "rank's own shard: there this is expected)"
)
_LOSS_CAUSE = (
    "that rank trains on other data or from another model state (a different dataset or "
    "preprocessing on its host, a checkpoint loaded on one rank only)"
)
_LOSS_FIX = "check that every rank reads the same dataset and starts from the same weights"


def _alert(ranks: RankColumns, findings: list[Finding], step: int, time: float) -> Alert:
    hosts = dict(zip(ranks.ranks, ranks.hosts, strict=False))
    group = findings[0].ranks
    where = " and ".join(sorted({hosts.get(r, "?") for r in group}))
    grads = any(f.metric == "grad_norm" for f in findings)
    verb = "are" if len(group) > 1 else "is"
    return cause_alert(
        RankDivergence.name,
        cause=f"{_names(group)} on {where} {verb} out of sync: "
        + (_GRAD_CAUSE if grads else _LOSS_CAUSE),
        said=f"{'they have' if len(group) > 1 else 'it has'} "
        + "; and ".join(f.what for f in findings),
        evidence={
            "ranks": list(group),
            "hosts": [hosts.get(r, "?") for r in group],
            **{f.metric: f.evidence for f in findings},
        },
        fix=_GRAD_FIX if grads else _LOSS_FIX,
        place=f"{_names(group).lower()} on {where}",
        step=step,
        time=time,
        subject=subjects.rank(group[0]),
    )


class RankDivergence(Base):
    """Ranks whose grad norms or losses disagree with the others': out of sync."""

    name = "rank_divergence"
    doc = RuleDoc(
        CAUSE,
        "ranks out of sync: gradients not averaged (every backward under `no_sync()`, no DDP), so "
        "the models drift apart",
        "a rank's `grad_norm` more than 0.1 % from the median of all ranks on more than half of "
        "the last 5 to 50 steps, or its loss far from the others'",
        "run each step's last backward outside `no_sync()` so DDP averages it",
        ("a sharded model (FSDP, ZeRO): each rank reports its own shard",),
    )

    def check(self, view: HealthView) -> Outcome:
        ranks = view.inp.ranks
        if ranks is None or len(ranks.ranks) < 2 or not ranks.steps.size:
            return nothing(self.name)
        by_subject: dict[str, list[Finding]] = {}
        for finding in out_of_sync(ranks):
            subject = subjects.rank(finding.ranks[0])
            by_subject.setdefault(subject, []).append(finding)

        def make(new: list[str]) -> list[Alert]:
            alerts = []
            for subject in new:
                findings = by_subject[subject]
                step = max(f.step for f in findings)
                at = int(step) if math.isfinite(step) else view.inp.step
                alerts.append(_alert(ranks, findings, at, view.inp.time))
            return alerts

        return Outcome(self.name, list(by_subject), always, make)


__all__ = [
    "GRAD_STEPS",
    "GRAD_TOLERANCE",
    "LOSS_STEPS",
    "LOSS_TOLERANCE",
    "WINDOW",
    "Finding",
    "RankDivergence",
    "out_of_sync",
]
