"""What the sampler publishes for readers on other threads, and the per-step history built
from it: the main thread reads these, never the pipeline's working state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.assemble.layers import LayerTable
from nbmonitor._engine.frame import Alert
from nbmonitor._engine.store import Store
from nbmonitor.health.finetune import AdapterVerdict

Columns = dict[str, npt.NDArray[np.float64]]


@dataclass(frozen=True)
class Published:
    """What the last tick left for readers (replaced whole, never mutated)."""

    open_rows: tuple[dict[str, float], ...] = ()
    alerts: tuple[Alert, ...] = ()
    layer_table: LayerTable | None = None  # as of the last health check
    adapters: AdapterVerdict | None = None  # is the fine-tune training (None: no adapters)
    step: int = 0


def history(steps: Store, published: Published) -> Columns:
    """The store's columns with the rows still open appended. ``published`` is read before the
    store: a row the sampler finalises in between is then in both (and dropped from the open
    ones), never in neither."""
    columns = steps.history()
    rows: Sequence[Mapping[str, float]] = published.open_rows
    if columns and len(columns["step"]):
        last = columns["step"][-1]
        rows = [r for r in rows if r["step"] > last]
    return merge_rows(columns, rows)


def merge_rows(columns: Columns, rows: Sequence[Mapping[str, float]]) -> Columns:
    """Append rows to equal-length columns, NaN-filling keys a side lacks."""
    if not rows:
        return columns
    n = len(next(iter(columns.values()))) if columns else 0
    keys = list(columns)
    for row in rows:
        keys.extend(k for k in row if k not in columns and k not in keys)
    out: Columns = {}
    for key in keys:
        old = columns.get(key, np.full(n, np.nan))
        new = np.array([row.get(key, np.nan) for row in rows], dtype=np.float64)
        out[key] = np.concatenate([old, new])
    return out
