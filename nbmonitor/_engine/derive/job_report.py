"""A distributed job judged from its ranks' streams: the straggler rule over the whole job,
and the record ``ranks_summary.json`` holds. Shared by the display rank at close
(``live/ranks.py``) and by a job opened from disk (``replay/job.py``); numpy only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from nbmonitor._engine.derive.ranks import (
    FloatArray,
    RankState,
    align,
    divergence,
    rank_columns,
    rank_metrics,
    ranks_summary,
)
from nbmonitor._engine.run_model import ranks_health_input
from nbmonitor.health import Alert, Health, Thresholds
from nbmonitor.health.rules.stragglers import MIN_STEPS, WINDOW, Stragglers

# A finished job is judged at most this many times (evenly spaced), however long it ran.
MAX_CHECKS = 500


def newest_time(state: RankState) -> float:
    """When the newest step any rank recorded ended (NaN before one): the time of a job's
    alerts, as the ranks' own files say, whoever reads them and whenever."""
    _, times = align(state, "time")
    finite = times[np.isfinite(times)]
    return float(finite.max()) if finite.size else math.nan


def job_alerts(state: RankState) -> list[Alert]:
    """The stragglers and the disagreeing ranks of the whole job so far."""
    return straggler_alerts(state) + divergence(state, newest_time(state))


def straggler_alerts(state: RankState, health: Health | None = None, since: int = 0) -> list[Alert]:
    """The straggler rule over the job's aligned steps after the first ``since``, judged every
    half window of steps (so a straggler of the middle of a run is found too); with
    ``health`` (kept between calls), only new episodes."""
    columns = rank_columns(state)
    if columns is None:
        return []
    health = health if health is not None else Health(Thresholds(), rules=(Stragglers,))
    n = columns.steps.size
    every = max(WINDOW // 2, n // MAX_CHECKS)
    ends = [e for e in ([*range(MIN_STEPS, n, every), n] if n >= MIN_STEPS else []) if e > since]
    _, times = align(state, "time")
    found: list[Alert] = []
    for end in ends:
        # The rule looks at the last WINDOW steps every rank recorded: a few windows back is
        # plenty, and keeps a long job's checks linear in its length.
        start = max(0, end - 4 * WINDOW)
        wait = columns.data_wait
        part = type(columns)(
            columns.ranks,
            columns.hosts,
            columns.steps[start:end],
            columns.step_time[:, start:end],
            None if wait is None else wait[:, start:end],
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
    "RankRun",
    "job_alerts",
    "newest_time",
    "read_state",
    "straggler_alerts",
    "summary_record",
]
