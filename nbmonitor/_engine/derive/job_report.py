"""A distributed job judged from its ranks' streams: the job rules over the whole job (the
straggler and same-batches rules step by step, the stalled-rank rule on where the ranks are
now), and the record ``ranks_summary.json`` holds. Shared by the display rank at close
(``live/ranks.py``) and by a job opened from disk (``replay/job.py``); numpy only.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from nbmonitor._engine.derive.ranks import (
    FloatArray,
    RankState,
    align,
    rank_columns,
    rank_metrics,
    ranks_summary,
)
from nbmonitor.health import Alert, Health, HealthInput, Thresholds
from nbmonitor.health.rule import RuleFactory
from nbmonitor.health.rules.replicas import SameBatches
from nbmonitor.health.rules.stalls import RankStalled
from nbmonitor.health.rules.stragglers import MIN_STEPS, WINDOW, Stragglers
from nbmonitor.health.rules.sync import RankDivergence
from nbmonitor.health.view import RankColumns

# The rules judged over a job's aligned steps, and the one judged on where its ranks are now.
STEP_RULES: tuple[RuleFactory, ...] = (Stragglers, SameBatches, RankDivergence)
NOW_RULES: tuple[RuleFactory, ...] = (RankStalled,)

# A finished job is judged at most this many times (evenly spaced), however long it ran.
MAX_CHECKS = 500


def ranks_health_input(columns: RankColumns, time: float) -> HealthInput:
    """What the job rules read of a job: every rank's step times, and nothing else."""
    step = int(columns.steps[-1]) if columns.steps.size else 0
    return HealthInput(step=step, time=time, steps={}, ranks=columns)


def newest_time(state: RankState) -> float:
    """When the newest step any rank recorded ended (NaN before one): the time of a job's
    alerts, as the ranks' own files say, whoever reads them and whenever."""
    _, times = align(state, "time")
    finite = times[np.isfinite(times)]
    return float(finite.max()) if finite.size else math.nan


def job_thresholds(state: RankState) -> Thresholds:
    """The thresholds the job's ranks ran with (their meta.json's, the lowest rank's that
    reads), else the defaults: a job is judged as it was live."""
    for r in sorted(state.ranks):
        said = state.ranks[r].meta.get("thresholds")
        if isinstance(said, Mapping):
            try:
                return Thresholds(**{str(k): v for k, v in said.items()})
            except (TypeError, ValueError):  # another version's fields, or an edited file
                continue
    return Thresholds()


def job_alerts(state: RankState) -> list[Alert]:
    """The stragglers, the ranks on the same batches, the ranks out of sync and a stalled
    rank (or job) of the whole job so far."""
    thresholds = job_thresholds(state)
    return straggler_alerts(state, Health(thresholds, rules=STEP_RULES)) + now_alerts(
        state, Health(thresholds, rules=NOW_RULES)
    )


def now_alerts(state: RankState, health: Health) -> list[Alert]:
    """The rules judged on where the ranks are now (``NOW_RULES``): a stalled rank; with
    ``health`` kept between calls, only new episodes."""
    columns = rank_columns(state)
    if columns is None:
        return []
    return health.check(ranks_health_input(columns, newest_time(state)))


def straggler_alerts(state: RankState, health: Health | None = None, since: int = 0) -> list[Alert]:
    """The step rules (``STEP_RULES``: stragglers, ranks on the same batches, ranks out of
    sync) over the job's
    aligned steps after the first ``since``, judged every half window of steps (so a
    straggler of the middle of a run is found too); with ``health`` (kept between calls),
    only new episodes."""
    columns = rank_columns(state)
    if columns is None:
        return []
    health = health if health is not None else Health(Thresholds(), rules=STEP_RULES)
    n = columns.steps.size
    every = max(WINDOW // 2, n // MAX_CHECKS)
    ends = [e for e in ([*range(MIN_STEPS, n, every), n] if n >= MIN_STEPS else []) if e > since]
    _, times = align(state, "time")
    found: list[Alert] = []
    for end in ends:
        # The rule looks at the last WINDOW steps every rank recorded: a few windows back is
        # plenty, and keeps a long job's checks linear in its length.
        start = max(0, end - 4 * WINDOW)
        wait, loss, grads = columns.data_wait, columns.loss, columns.grad_norm
        part = dataclasses.replace(
            columns,
            steps=columns.steps[start:end],
            step_time=columns.step_time[:, start:end],
            data_wait=None if wait is None else wait[:, start:end],
            loss=None if loss is None else loss[:, start:end],
            grad_norm=None if grads is None else grads[:, start:end],
            progress=None,  # where the ranks are now is judged once (now_alerts)
        )
        when = times[:, end - 1] if times.shape[1] >= end else np.empty(0)
        finite = when[np.isfinite(when)]
        found += health.check(
            ranks_health_input(part, float(finite.max()) if finite.size else math.nan)
        )
    return found


class RankRun(Protocol):
    """What a job's rank is read from: its run on disk (``nbmonitor.runs.Run``)."""

    @property
    def meta(self) -> dict[str, Any]: ...
    @property
    def status(self) -> str: ...
    def history(self) -> Mapping[str, FloatArray]: ...
    def system(self) -> Mapping[str, FloatArray]: ...


def read_state(ranks: Mapping[int, RankRun]) -> RankState:
    """Every rank's steps and system samples, as they are on disk now."""
    state = RankState()
    for rank, run in ranks.items():
        state.set_meta(rank, run.meta, run.status)
        state.add_columns(rank, "steps", run.history())
        state.add_columns(rank, "system", run.system())
    return state


def summary_record(files_meta: dict[str, Any], state: RankState, status: str) -> dict[str, Any]:
    """What ranks_summary.json holds."""
    return {
        "job_id": files_meta.get("job_id"),
        "world_size": files_meta.get("world_size"),
        "status": status,
        "written": time.time(),
        "ranks": {
            str(r): {
                "host": state.host(r),
                "device": state.ranks[r].meta.get("device"),
                **rank_metrics(state, r),
            }
            for r in sorted(state.ranks)
        },
        "summary": ranks_summary(state),
    }


__all__ = [
    "MAX_CHECKS",
    "NOW_RULES",
    "STEP_RULES",
    "RankRun",
    "job_alerts",
    "job_thresholds",
    "newest_time",
    "now_alerts",
    "read_state",
    "straggler_alerts",
    "summary_record",
]
