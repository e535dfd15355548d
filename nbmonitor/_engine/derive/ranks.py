"""Cross-rank figures of a distributed job, computed from every rank's own streams (numpy only).

No rank gathers anything: each rank writes its run (``rank<r>/``), and whoever reads the job
(a notebook with ``nbmonitor.open``/``tail``, or rank 0 at close) fills a :class:`RankState`
and derives from it:

* per step, across ranks: step time min / median / max and the slowest rank (``per_step``);
* the ranks x steps matrix of a metric, for the heatmap (``align``);
* per rank, its step time, data wait and its own device's utilisation, memory, temperature
  and power (``rank_metrics``), and the Oumi-style summary across ranks of each (``summary``:
  count, mean, median, std, min, max and the ranks holding the min and the max);
* the job rules' input (``rank_columns``): the ranks' step columns aligned, and where each
  rank is now.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from nbmonitor.health.view import RankColumns, RankProgress

FloatArray = npt.NDArray[np.float64]

STEP_KEYS = ("step", "time", "step_time", "phase_data_s", "loss", "grad_norm")
SYSTEM_KEYS = ("step", "time", "phase", "cpu_percent", "ram_used_bytes", "ram_total_bytes")
# A rank's own device metrics (``gpu<i>_<field>`` of its device), each reduced per rank as
# given; the process's own CPU and memory stand in on CPU-only ranks.
DEVICE_FIELDS = {
    "util_percent": "mean",
    "mem_used_bytes": "max",
    "temperature_c": "max",
    "power_w": "mean",
}
PROCESS_FIELDS = {"process_cpu_percent": "mean", "process_rss_bytes": "max"}
TIME_FIELDS = {"step_time": "mean", "phase_data_s": "mean"}
# A followed job keeps at most this many steps per rank in memory (the files keep them all).
MAX_STEPS = 200_000


@dataclass
class _Rank:
    max_steps: int = MAX_STEPS
    meta: Mapping[str, Any] = field(default_factory=dict)
    blocks: dict[str, list[dict[str, FloatArray]]] = field(default_factory=dict)
    status: str = "running"

    def add(self, stream: str, columns: Mapping[str, FloatArray]) -> None:
        n = len(next(iter(columns.values()), ()))
        if n:
            self.blocks.setdefault(stream, []).append(
                {k: np.asarray(v) for k, v in columns.items()}
            )

    def columns(self, stream: str) -> dict[str, FloatArray]:
        blocks = self.blocks.get(stream, [])
        if len(blocks) > 1:
            keys = list(dict.fromkeys(k for b in blocks for k in b))
            merged = {
                k: np.concatenate([b.get(k, np.full(_rows(b), math.nan)) for b in blocks])[
                    -self.max_steps :
                ]
                for k in keys
            }
            self.blocks[stream] = blocks = [merged]
        return dict(blocks[0]) if blocks else {}


def _rows(block: Mapping[str, FloatArray]) -> int:
    return len(next(iter(block.values()), ()))


class RankState:
    """What the ranks of a job have written so far, by rank (the newest ``max_steps`` rows of
    each stream)."""

    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        self.ranks: dict[int, _Rank] = {}
        self.max_steps = max_steps

    def _rank(self, r: int) -> _Rank:
        if r not in self.ranks:
            self.ranks[r] = _Rank(self.max_steps)
        return self.ranks[r]

    def set_meta(self, r: int, meta: Mapping[str, Any], status: str | None = None) -> None:
        state = self._rank(r)
        state.meta = meta
        if status is not None:
            state.status = status

    def add_columns(self, r: int, stream: str, columns: Mapping[str, FloatArray]) -> None:
        """A whole stream of rank ``r`` (or a block of it): only the columns used here."""
        self._rank(r).add(stream, {k: v for k, v in columns.items() if _kept(stream, k)})

    def add_rows(self, r: int, stream: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """New records of rank ``r`` (a tail)."""
        keys = list(dict.fromkeys(k for row in rows for k in row if _kept(stream, k)))
        self.add_columns(r, stream, {k: np.array([_num(row.get(k)) for row in rows]) for k in keys})

    def columns(self, r: int, stream: str) -> dict[str, FloatArray]:
        state = self.ranks.get(r)
        return state.columns(stream) if state is not None else {}

    def host(self, r: int) -> str:
        state = self.ranks.get(r)
        return str(state.meta.get("hostname") or state.meta.get("host") or "?") if state else "?"

    def status(self, r: int) -> str:
        """Rank ``r``'s run status: its meta.json's once it closed, else what its reader said."""
        state = self.ranks.get(r)
        if state is None:
            return "unknown"
        said = state.meta.get("status")
        return said if isinstance(said, str) and state.status == "running" else state.status

    def pid(self, r: int) -> int | None:
        state = self.ranks.get(r)
        pid = state.meta.get("pid") if state else None
        return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None

    def started(self, r: int) -> float:
        """When rank ``r``'s run started (its meta.json's ``start_timestamp``; NaN if unsaid)."""
        state = self.ranks.get(r)
        return _num(state.meta.get("start_timestamp")) if state else math.nan

    def device_index(self, r: int) -> int | None:
        state = self.ranks.get(r)
        index = state.meta.get("device_index") if state else None
        return index if isinstance(index, int) and not isinstance(index, bool) else None


def _kept(stream: str, key: str) -> bool:
    if stream == "steps":
        return key in STEP_KEYS
    if stream != "system":
        return False
    return key in SYSTEM_KEYS or key.startswith(("gpu", "process"))


def _num(value: object) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else math.nan  # type: ignore[arg-type]


def align(state: RankState, key: str, stream: str = "steps") -> tuple[FloatArray, FloatArray]:
    """(steps, matrix): the union of the ranks' steps, and ``key`` per rank (rows in rank
    order) at each; NaN where a rank has no value. A step recorded twice keeps its last."""
    per_rank = [state.columns(r, stream) for r in sorted(state.ranks)]
    found = [c["step"] for c in per_rank if "step" in c and key in c]
    if found and all(np.array_equal(found[0], f) for f in found[1:]) and _increasing(found[0]):
        steps = found[0]  # the usual case: every rank has the same steps (no sort needed)
    else:
        steps = np.unique(np.concatenate(found)) if found else np.empty(0)
    steps = steps[np.isfinite(steps)]
    matrix = np.full((len(per_rank), steps.size), math.nan)
    for i, cols in enumerate(per_rank):
        if "step" in cols and key in cols and steps.size:
            at = np.searchsorted(steps, cols["step"])
            ok = (at < steps.size) & np.isfinite(cols["step"])
            matrix[i, at[ok]] = cols[key][ok]  # later rows overwrite earlier ones
    return steps, matrix


def _increasing(steps: FloatArray) -> bool:
    return bool(steps.size < 2 or np.all(steps[1:] > steps[:-1]))


def rank_columns(state: RankState) -> RankColumns | None:
    """The job rules' input: every rank's step time, data wait, loss and grad norm, aligned,
    and where each rank is now."""
    if len(state.ranks) < 2:
        return None
    steps, times = align(state, "step_time")

    def aligned(key: str) -> FloatArray | None:
        at, matrix = align(state, key)
        return matrix if at.shape == steps.shape and np.array_equal(at, steps) else None

    ranks = tuple(sorted(state.ranks))
    return RankColumns(
        ranks,
        tuple(state.host(r) for r in ranks),
        steps,
        times,
        aligned("phase_data_s"),
        aligned("loss"),
        rank_progress(state, ranks),
        aligned("grad_norm"),
    )


def _newest(columns: Mapping[str, FloatArray], key: str, clock: str = "time") -> float:
    """``key`` in the newest row with a finite ``clock`` (NaN if none)."""
    when, values = columns.get(clock), columns.get(key)
    if when is None or values is None or values.shape != when.shape:
        return math.nan
    finite = np.flatnonzero(np.isfinite(when))
    return float(values[finite[-1]]) if finite.size else math.nan


def rank_progress(state: RankState, ranks: Sequence[int]) -> RankProgress:
    """Where each rank is now: its newest system sample (time, steps done, phase), when its
    newest step ended and when its run started."""
    seen, step, phase, end = [], [], [], []
    for r in ranks:
        system, steps = state.columns(r, "system"), state.columns(r, "steps")
        seen.append(_newest(system, "time"))
        done = [_newest(system, "step"), _newest(steps, "step")]
        step.append(max((d for d in done if math.isfinite(d)), default=math.nan))
        phase.append(_newest(system, "phase"))
        end.append(_newest(steps, "time"))
    return RankProgress(
        np.array(seen),
        np.array(step),
        np.array(phase),
        np.array(end),
        tuple(state.status(r) for r in ranks),
        tuple(state.pid(r) for r in ranks),
        np.array([state.started(r) for r in ranks]),
    )


def per_step(steps: FloatArray, matrix: FloatArray, ranks: Sequence[int]) -> dict[str, FloatArray]:
    """Per step across ranks: ``min``, ``median``, ``max`` and ``slowest_rank`` (NaN where no
    rank has a value)."""
    out = {"step": steps}
    filled = np.isfinite(matrix).any(axis=0) if matrix.size else np.zeros(steps.size, bool)
    for name, fn in (("min", np.nanmin), ("median", np.nanmedian), ("max", np.nanmax)):
        column = np.full(steps.size, math.nan)
        if filled.any():
            column[filled] = fn(matrix[:, filled], axis=0)
        out[name] = column
    slowest = np.full(steps.size, math.nan)
    if filled.any():
        arg = np.nanargmax(np.where(np.isfinite(matrix[:, filled]), matrix[:, filled], -np.inf), 0)
        slowest[filled] = np.asarray(ranks, dtype=np.float64)[arg]
    out["slowest_rank"] = slowest
    return out


def _reduce(values: FloatArray, how: str) -> float:
    finite = values[np.isfinite(values)]
    if not finite.size:
        return math.nan
    return float(finite.max() if how == "max" else finite.mean())


def rank_metrics(state: RankState, r: int) -> dict[str, float]:
    """Rank ``r``'s step time and data wait (mean), and its own device's (or process's)
    metrics, reduced over the run as ``DEVICE_FIELDS`` / ``PROCESS_FIELDS`` say."""
    steps, system = state.columns(r, "steps"), state.columns(r, "system")
    out = {k: _reduce(steps[k], how) for k, how in TIME_FIELDS.items() if k in steps}
    index = state.device_index(r)
    if index is not None:
        for fname, how in DEVICE_FIELDS.items():
            key = f"gpu{index}_{fname}"
            if key in system:
                out[f"gpu_{fname}"] = _reduce(system[key], how)
    for key, how in PROCESS_FIELDS.items():
        if key in system:
            out[key] = _reduce(system[key], how)
    return out


def summary(values: Mapping[int, float]) -> dict[str, float]:
    """Oumi-style summary of one figure across ranks: ``count``, ``mean``, ``median``,
    ``std`` (sample; 0 for one rank), ``min``, ``max``, ``min_rank``, ``max_rank``."""
    items = [(r, v) for r, v in sorted(values.items()) if math.isfinite(v)]
    if not items:
        return {"count": 0}
    ranks = np.array([r for r, _ in items])
    x = np.array([v for _, v in items])
    return {
        "count": x.size,
        "mean": float(x.mean()),
        "median": float(np.median(x)),
        "std": float(x.std(ddof=1)) if x.size > 1 else 0.0,
        "min": float(x.min()),
        "max": float(x.max()),
        "min_rank": int(ranks[int(x.argmin())]),
        "max_rank": int(ranks[int(x.argmax())]),
    }


def ranks_summary(state: RankState) -> dict[str, dict[str, float]]:
    """Every figure of :func:`rank_metrics`, summarised across ranks."""
    metrics = {r: rank_metrics(state, r) for r in sorted(state.ranks)}
    names = list(dict.fromkeys(k for m in metrics.values() for k in m))
    return {k: summary({r: m.get(k, math.nan) for r, m in metrics.items()}) for k in names}


__all__ = [
    "RankState",
    "align",
    "per_step",
    "rank_columns",
    "rank_metrics",
    "rank_progress",
    "ranks_summary",
    "summary",
]
