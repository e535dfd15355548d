"""The layers panel: per-layer gradient norms as a layers x steps heatmap, and the table of the
latest value per parameter (norm, update ratio, activations, flags).

The heatmap is the one payload that grows with the model, so its cells are capped: columns
(steps) are merged by max, so a spike survives; rows (layers) are all kept, with their full
names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import Frame, LayerFrame
from nbmonitor.ui.codec import encode
from nbmonitor.ui.panels.base import Unchanged

MAX_HEATMAP_CELLS = 65_536
MAX_HEATMAP_COLUMNS = 240


def jsonable(value: object) -> Any:
    """A JSON-safe value for a synced trait: NaN/inf become None (JSON has no NaN), numpy
    scalars become Python numbers, tuples and arrays become lists."""
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, Iterable):
        return [jsonable(v) for v in value]
    return str(value)


def bound_heatmap(
    grid: npt.NDArray[np.float64], steps: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64]]:
    """Merge adjacent columns (max, NaN-aware) until the grid fits the cell budget."""
    rows, cols = grid.shape
    limit = max(1, min(MAX_HEATMAP_COLUMNS, MAX_HEATMAP_CELLS // max(rows, 1)))
    if cols <= limit:
        return np.ascontiguousarray(grid, dtype=np.float32), np.asarray(steps, dtype=np.float64)
    edges = np.linspace(0, cols, limit + 1).astype(np.int64)
    # -inf marks "no finite value" so that a bucket is NaN only when all of it is.
    filled = np.where(np.isnan(grid), -np.inf, grid)
    merged = np.maximum.reduceat(filled, edges[:-1], axis=1)
    merged[np.isneginf(merged)] = np.nan
    return merged.astype(np.float32), np.asarray(steps, dtype=np.float64)[edges[1:] - 1]


def heatmap_state(
    grid: npt.NDArray[np.float64], steps: npt.NDArray[np.float64], names: list[str]
) -> dict[str, Any]:
    """``{names, grid, steps}`` with the grid bounded; an inconsistent grid draws nothing."""
    if grid.ndim != 2 or grid.shape != (len(names), len(steps)):
        grid, steps = np.zeros((0, 0)), np.zeros(0)
    bounded, columns = bound_heatmap(grid, steps)
    return {
        "names": names,
        "grid": encode(bounded),
        "steps": encode(columns, "float64"),
    }


def layers_state(layers: LayerFrame) -> dict[str, Any]:
    state = heatmap_state(
        np.asarray(layers.log10_grad_norm, dtype=np.float64),
        np.asarray(layers.steps, dtype=np.float64),
        list(layers.names),
    )
    state["table"] = [jsonable(row) for row in layers.table]
    return state


class LayersPanel:
    name: ClassVar[str] = "layers"

    def __init__(self) -> None:
        self._unchanged = Unchanged()

    def state(self, frame: Frame) -> dict[str, Any] | None:
        if frame.layers is None:
            return self._unchanged.filter({})
        return self._unchanged.filter(layers_state(frame.layers))
