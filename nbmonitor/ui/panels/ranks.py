"""The ranks panel: a distributed job's ranks side by side, from a ``RanksFrame``.

A ranks x steps heatmap of step time (rows are ranks, colours capped at the 99th percentile so
that a slow first step does not darken every other cell), and three tables: one row per rank
(host, device, step time, data wait, device metrics, last loss and grad norm, flags), the newest
steps with step time min / median / max and the slowest rank, and the cross-rank summary. The
text helpers also serve scripts (``nbmonitor.ui.ranks``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from nbmonitor._engine.frame import RanksFrame
from nbmonitor.ui.panels.base import Unchanged
from nbmonitor.ui.panels.layers import heatmap_state

SUMMARY_FIELDS = ("count", "mean", "median", "std", "min", "max", "min_rank", "max_rank")
RANK_COLUMNS = (
    ("rank", "rank"),
    ("host", "host"),
    ("device", "device"),
    ("status", "status"),
    ("steps", "steps"),
    ("step_time", "step time (s)"),
    ("phase_data_s", "data wait (s)"),
    ("gpu_util_percent", "GPU util %"),
    ("gpu_mem_used_bytes", "GPU mem (GiB)"),
    ("gpu_temperature_c", "GPU °C"),
    ("process_cpu_percent", "CPU %"),
    ("process_rss_bytes", "RSS (GiB)"),
    ("loss", "loss"),
    ("grad_norm", "grad norm"),
    ("flags", "flags"),
)
STEP_COLUMNS = (
    ("step", "step"),
    ("min", "min (s)"),
    ("median", "median (s)"),
    ("max", "max (s)"),
    ("slowest_rank", "slowest rank"),
)


def fmt(value: object, key: str = "") -> str:
    """A cell: bytes in GiB, ranks and steps as integers, NaN as a dash."""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        return str(value)
    v = float(value)
    if not math.isfinite(v):
        return "–"
    if key.endswith("_bytes"):
        return f"{v / 2**30:.2f}"
    if key in ("step", "steps", "rank", "count") or key.endswith("_rank"):
        return f"{v:.0f}"
    return f"{v:.4g}"


def summary_rows(summary: Mapping[str, Mapping[str, float]]) -> list[list[str]]:
    """The cross-rank summary as text rows (a header, then one row per metric)."""
    rows = [["metric", *SUMMARY_FIELDS]]
    for metric, stats in summary.items():
        rows.append([metric, *(fmt(stats.get(f, math.nan), f) for f in SUMMARY_FIELDS)])
    return rows


def tables(frame: RanksFrame) -> list[dict[str, Any]]:
    """The three tables as ``{field, title, head, rows}`` of text cells."""
    steps = [[fmt(r.get(k, math.nan), k) for k, _ in STEP_COLUMNS] for r in frame.per_step[::-1]]
    ranks = [[fmt(r.get(k, math.nan), k) for k, _ in RANK_COLUMNS] for r in frame.table]
    summary = summary_rows(frame.summary)
    return [
        {"field": "ranks", "title": "Ranks", "head": [h for _, h in RANK_COLUMNS], "rows": ranks},
        {
            "field": "per_step",
            "title": "Step time across ranks (newest steps)",
            "head": [h for _, h in STEP_COLUMNS],
            "rows": steps,
        },
        {
            "field": "summary",
            "title": "Cross-rank summary",
            "head": summary[0],
            "rows": summary[1:],
        },
    ]


def heat_state(frame: RanksFrame) -> dict[str, Any]:
    """The ranks x steps heatmap, ``{}`` when the frame has none."""
    heat = np.asarray(frame.heat, dtype=np.float64)
    if heat.ndim != 2 or heat.shape != (len(frame.ranks), len(frame.steps)) or not heat.size:
        return {}
    label = frame.heat_metric
    finite = heat[np.isfinite(heat)]
    if finite.size >= 100:
        # A few slow steps (the first, a checkpoint) would leave every other cell dark: the
        # colours stop at the 99th percentile, and the legend says so.
        cap = float(np.percentile(finite, 99))
        if cap < float(finite.max()):
            heat = np.minimum(heat, cap)  # NaN stays NaN
            label = f"{label} (capped at the 99th percentile)"
    names = [f"rank{r} ({h})" for r, h in zip(frame.ranks, frame.hosts, strict=True)]
    state = heatmap_state(heat, np.asarray(frame.steps, dtype=np.float64), names)
    state["title"] = f"{frame.heat_metric} per rank (ranks \u00d7 steps)"
    state["label"] = label
    return state


class RanksPanel:
    name: ClassVar[str] = "ranks"

    def __init__(self) -> None:
        self._unchanged = Unchanged()

    def state(self, frame: RanksFrame) -> dict[str, Any] | None:
        return self._unchanged.filter({"heat": heat_state(frame), "tables": tables(frame)})
