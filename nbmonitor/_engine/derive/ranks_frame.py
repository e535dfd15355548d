"""What the ranks panel shows of a distributed job: ``RanksFrame``, built from a ``RankState``
(``ranks.py``) by :func:`ranks_frame`. Re-exported by ``_engine.frame``, where views read it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nbmonitor._engine.derive.ranks import (
    DEVICE_FIELDS,
    FloatArray,
    RankState,
    align,
    per_step,
    rank_metrics,
    ranks_summary,
)
from nbmonitor.health.alert import Alert, rank

PER_STEP_ROWS = 10  # newest steps in the frame's per-step table
# The host's gauges, from the lowest rank's newest system sample.
HOST_KEYS = ("cpu_percent", "ram_used_bytes", "ram_total_bytes", "process_cpu_percent",
             "process_rss_bytes")  # fmt: skip
DEVICE_GAUGES = (*DEVICE_FIELDS, "mem_total_bytes")


@dataclass(frozen=True)
class RanksFrame:
    """What the ranks panel shows of a job at one moment (built by :func:`ranks_frame`)."""

    job: str
    status: str
    world_size: int
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    heat_metric: str  # the metric of the heatmap (``step_time`` by default)
    steps: FloatArray  # heatmap columns
    heat: FloatArray  # (len(ranks), len(steps)), NaN where unknown
    per_step: tuple[dict[str, float], ...]  # newest steps: step, min, median, max, slowest_rank
    table: tuple[dict[str, object], ...]  # one row per rank
    summary: dict[str, dict[str, float]]
    alerts: tuple[Alert, ...] = ()
    system: dict[str, float] | None = None  # the lowest rank's host, newest sample
    devices: tuple[dict[str, float | str], ...] = ()  # each rank's own GPU, newest sample


def ranks_frame(
    state: RankState,
    job: str,
    status: str,
    world_size: int,
    alerts: Sequence[Alert] = (),
    heat_metric: str = "step_time",
) -> RanksFrame:
    ranks = tuple(sorted(state.ranks))
    steps, heat = align(state, heat_metric)
    time_steps, times = align(state, "step_time")
    stats = per_step(time_steps, times, ranks)
    n = min(PER_STEP_ROWS, time_steps.size)
    rows = tuple(
        {k: float(v[j]) for k, v in stats.items()}
        for j in range(time_steps.size - n, time_steps.size)
    )
    flagged: dict[str, list[str]] = {}
    for a in alerts:
        flagged.setdefault(a.subject, []).append(a.rule)
    table: list[dict[str, object]] = []
    for r in ranks:
        cols = state.columns(r, "steps")
        row: dict[str, object] = {
            "rank": r,
            "host": state.host(r),
            "device": str(state.ranks[r].meta.get("device", "?")),
            "status": state.ranks[r].status,
            "steps": int(np.isfinite(cols["step"]).sum()) if "step" in cols else 0,
        }
        row.update(rank_metrics(state, r))
        for key in ("loss", "grad_norm"):
            if key in cols:
                finite = cols[key][np.isfinite(cols[key])]
                row[key] = float(finite[-1]) if finite.size else math.nan
        row["flags"] = sorted(set(flagged.get(rank(r), [])))
        table.append(row)
    host, devices = _gauges(state, ranks)
    return RanksFrame(
        job=job,
        status=status,
        world_size=world_size,
        ranks=ranks,
        hosts=tuple(state.host(r) for r in ranks),
        heat_metric=heat_metric,
        steps=steps,
        heat=heat,
        per_step=rows,
        table=tuple(table),
        summary=ranks_summary(state),
        alerts=tuple(alerts),
        system=host,
        devices=tuple(devices),
    )


def _last(values: FloatArray | None) -> float:
    if values is None:
        return math.nan
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if finite.size else math.nan


def _gauges(
    state: RankState, ranks: Sequence[int]
) -> tuple[dict[str, float], list[dict[str, float | str]]]:
    system = state.columns(ranks[0], "system") if ranks else {}
    host = {k: _last(system.get(k)) for k in HOST_KEYS}
    devices: list[dict[str, float | str]] = []
    for r in ranks:
        index = state.device_index(r)
        if index is None:
            continue
        cols = state.columns(r, "system")
        card: dict[str, float | str] = {
            f: _last(cols.get(f"gpu{index}_{f}")) for f in DEVICE_GAUGES
        }
        card["name"] = f"rank{r} ({state.host(r)})"
        devices.append(card)
    return host, devices


__all__ = ["PER_STEP_ROWS", "RanksFrame", "ranks_frame"]
