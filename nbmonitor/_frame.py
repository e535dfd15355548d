"""The snapshot a view renders: plain numbers and numpy arrays, no torch, no widgets.

The sampler builds one Frame per publish; views (the notebook dashboard, the console line)
only read it. Keeping this the single hand-off keeps ``ui/`` free of torch and the engine free
of widget libraries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Series:
    """One line of a chart, already decimated for display (a few thousand points at most).

    ``x`` is the training step (float64 so that bucket edges can be fractional), ``y`` the value;
    non-finite points are left out because a chart cannot draw them (the alerts report them).
    """

    x: FloatArray
    y: FloatArray

    @property
    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes)


MAX_NAMED = 5  # names listed in a message before "and N more"; Alert.layers keeps them all


def name_list(names: Sequence[str], limit: int = MAX_NAMED) -> str:
    """``"a, b, c and 4 more"``: how every alert message lists layers or parameters."""
    shown = ", ".join(names[:limit])
    if len(names) > limit:
        shown += f" and {len(names) - limit} more"
    return shown


@dataclass(frozen=True)
class Alert:
    """A health finding shown in the alerts strip and written to the run log."""

    rule: str
    severity: str  # "info" | "warning" | "error"
    message: str  # plain-language diagnosis with a hint
    step: int
    time: float
    layers: tuple[str, ...] = ()


@dataclass(frozen=True)
class LayerFrame:
    """Per-layer view: names, a layers x columns heatmap of log10 grad norm, and a table."""

    names: tuple[str, ...]
    steps: FloatArray  # x of each heatmap column
    log10_grad_norm: FloatArray  # shape (len(names), len(steps)); NaN where unknown
    table: tuple[dict[str, object], ...] = ()


@dataclass(frozen=True)
class Frame:
    """Everything a view shows at one moment.

    ``latest`` holds the newest value of each per-step metric (``loss``, ``lr``, ``grad_norm``,
    ``step_time``, ``samples_per_s``, ...) and each system metric (``cpu_percent``,
    ``ram_used_bytes``, ``gpu0_util_percent``, ...); NaN means unavailable.
    ``series`` maps a chart line name (the metric key, plus ``loss_smooth``) to its decimated
    points; system series are drawn against the training step current when they were sampled.
    ``devices`` lists one dict per accelerator with its gauge values (empty on CPU).
    """

    run: str
    backend: str
    status: str  # "running" | "degraded" | "closed"
    step: int
    total_steps: int | None
    elapsed_s: float
    eta_s: float
    latest: dict[str, float]
    series: dict[str, Series] = field(default_factory=dict)
    devices: tuple[dict[str, float | str], ...] = ()
    alerts: tuple[Alert, ...] = ()
    errors: tuple[str, ...] = ()
    layers: LayerFrame | None = None
