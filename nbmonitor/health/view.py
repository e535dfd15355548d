"""What one check looks at: ``HealthInput`` (given by the caller) and ``HealthView`` (the index
bookkeeping every rule shares: which rows and layer columns are new since the previous
check, and the reference window before them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from nbmonitor.health.adapters import Adapters
from nbmonitor.health.structure import Structure
from nbmonitor.health.window import BoolArray, FloatArray
from nbmonitor.records import OptimizerRecord

T = TypeVar("T")


@dataclass(frozen=True)
class RankProgress:
    """Where each rank of a job is now, as its newest records say (rows follow
    ``RankColumns.ranks``; times are each rank's wall clock, NaN where unknown)."""

    seen: FloatArray  # (r,) when its newest system sample was taken
    step: FloatArray  # (r,) the steps it had completed then
    phase: FloatArray  # (r,) the step phase it was in then (index into records.PHASES)
    step_end: FloatArray  # (r,) when its newest completed step ended
    status: tuple[str, ...]  # its run's status (``running``, ``closed``, ...)
    pids: tuple[int | None, ...]  # its process id, from its meta.json
    started: FloatArray | None = None  # (r,) when its run started, from its meta.json

    @property
    def now(self) -> float:
        """The newest time any rank wrote (the job's clock, as its files say)."""
        finite = self.seen[np.isfinite(self.seen)]
        return float(finite.max()) if finite.size else math.nan

    @property
    def ended(self) -> tuple[bool, ...]:
        """Whether each rank closed its run (a process killed before closing has not)."""
        return tuple(s in ("closed", "degraded", "stopped") for s in self.status)


@dataclass(frozen=True)
class RankColumns:
    """Per-step columns of every rank of a distributed job, aligned on ``steps`` (the union of
    the ranks' steps; NaN where a rank has no row for a step). Rows follow ``ranks``."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    steps: FloatArray  # (k,)
    step_time: FloatArray  # (len(ranks), k) seconds between optimizer steps
    data_wait: FloatArray | None = None  # (len(ranks), k) data_wait_s, when measured
    loss: FloatArray | None = None  # (len(ranks), k) each rank's own loss, when logged
    progress: RankProgress | None = None  # where each rank is now (the stalled-rank rule)
    grad_norm: FloatArray | None = None  # (len(ranks), k) each rank's own grad norm


@dataclass(frozen=True)
class HealthInput:
    """What one check looks at. Arrays are read, never modified.

    ``steps`` holds recent full-resolution per-step columns of equal length, oldest first
    (``step`` is required for the step rules; ``loss``, ``grad_norm``, ``time`` are used when
    present). Per-layer arrays have one row per name in ``layer_names`` (parameter order); NaN
    means unknown / no gradient.
    """

    step: int
    time: float
    steps: Mapping[str, FloatArray]
    layer_names: tuple[str, ...] = ()
    layer_steps: FloatArray | None = None  # (k,) steps of the per-layer columns
    layer_grad_norms: FloatArray | None = None  # (len(layer_names), k)
    param_norms: FloatArray | None = None  # (len(layer_names),) latest parameter norms
    update_ratios: FloatArray | None = None  # (len(layer_names),) latest ||dw||/||w||
    activations: Mapping[str, Mapping[str, float]] | None = None  # module -> stats
    system: Mapping[str, FloatArray] | None = None  # recent system samples (device rules)
    gpus: Sequence[int] | None = None  # training GPU indices for the device rules
    # The update ratios of recent measured steps, oldest first: (k,) steps and
    # (len(layer_names), k) ratios; ``update_ratios`` is their newest column.
    update_steps: FloatArray | None = None
    update_series: FloatArray | None = None
    param_series: FloatArray | None = None  # the parameter norms at those steps, alike
    # What each module is (``"3" -> "Linear"``), for naming layers in messages and fitting
    # the advice to the model; parameter names map through their module.
    module_kinds: Mapping[str, str] | None = None
    # Every rank of a distributed job (the straggler, same-batches and stalled-rank rules).
    ranks: RankColumns | None = None
    # What the optimizer is and which faster implementations it offers (the time rules
    # suggest only those the run does not use); None when not known.
    optimizer: OptimizerRecord | None = None
    # The planned number of steps (attach(total_steps=...)), None when not given: a schedule
    # that has decayed to nothing long before it is stepped too fast.
    total_steps: int | None = None
    # What the training side read of the model, the optimizer, the loss's graph and the
    # loop's order (health/structure.py); None when nothing was read.
    structure: Structure | None = None
    # The adapters of a fine-tune and the base they sit on (read at attach), or None.
    adapters: Adapters | None = None
    # When the monitor's own sampler was busy, as (start, end) on the steps' ``time`` clock,
    # oldest first (``end`` inf: the tick still running). A step that overlapped one competed
    # with the monitor for the interpreter, which slows a Python-bound phase (a for-loop
    # optimizer) most: the time rules read their shares from the other steps.
    monitor_busy: tuple[tuple[float, float], ...] = ()


class HealthView:
    """One check's reading of a ``HealthInput``: the new rows and layer columns since the
    previous check (``last_step``, ``last_layer_step``) and the reference window before them.

    Rules only judge new data; with none, nothing is judged, so a paused run neither raises
    nor clears anything.
    """

    def __init__(
        self, inp: HealthInput, last_step: float | None, last_layer_step: float | None, window: int
    ) -> None:
        self.inp = inp
        self.last_step = last_step
        step_col = inp.steps.get("step")
        self.step_col = (
            np.asarray(step_col, dtype=np.float64) if step_col is not None else np.empty(0)
        )
        n = self.step_col.size
        self.new_from = new_from(self.step_col, last_step)
        self.ref_from = max(0, self.new_from - window)
        self.has_new_rows = self.new_from < n
        times = inp.steps.get("time")
        self._times = np.asarray(times, dtype=np.float64) if times is not None else None

        self.layer_names = inp.layer_names
        grads = inp.layer_grad_norms
        layer_steps = inp.layer_steps
        self.grads: FloatArray | None = None
        self.layer_step_col = np.empty(0)
        self.layer_new_from = 0
        if (
            grads is not None
            and layer_steps is not None
            and grads.ndim == 2
            and grads.shape[0] == len(inp.layer_names)
            and grads.shape[1] == layer_steps.size
        ):
            self.grads = np.asarray(grads, dtype=np.float64)
            self.layer_step_col = np.asarray(layer_steps, dtype=np.float64)
            self.layer_new_from = new_from(self.layer_step_col, last_layer_step)
        self.layer_ref_from = max(0, self.layer_new_from - window)
        self.has_new_layers = self.layer_new_from < self.layer_step_col.size
        self._index: dict[str, int] | None = None
        # What the rules read alike, made once per check (``shared``).
        self._shared: dict[Hashable, Any] = {}
        self.made = 0  # how many shared values were made (the tests count them)

    def shared(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, made once for this check and shared by every rule that asks for the
        same ``key`` (a primitive several rules read over the same columns: a column's
        windows' minima, its reference median, the steps that ran apart from the monitor).
        What ``make`` returns is read, never modified."""
        try:
            return cast(T, self._shared[key])
        except KeyError:
            self.made += 1
            value = self._shared[key] = make()
            return value

    def column(self, key: str) -> FloatArray | None:
        """The step column ``key`` as float64 (None when absent or of another length)."""
        return self.shared(("column", key), lambda: self._column(key))

    def _column(self, key: str) -> FloatArray | None:
        values = self.inp.steps.get(key)
        if values is None or len(values) != self.step_col.size:
            return None
        return np.asarray(values, dtype=np.float64)

    def layer_index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {name: i for i, name in enumerate(self.layer_names)}
        return self._index

    def layer_judged(self, mask: BoolArray) -> Callable[[str], bool]:
        index = self.layer_index()

        def judged(name: str) -> bool:
            i = index.get(name)
            return i is not None and bool(mask[i])

        return judged

    def time_at(self, step: float) -> float:
        """Wall time of a step's row when known, else the time of this check."""
        if self._times is not None and self._times.size == self.step_col.size:
            i = int(np.searchsorted(self.step_col, step))
            if i < self.step_col.size and self.step_col[i] == step:
                when = float(self._times[i])
                if math.isfinite(when):
                    return when
        return self.inp.time


def new_from(steps: FloatArray, last: float | None) -> int:
    """Index of the first entry after ``last`` (every entry on the first check, or when the
    columns were restarted). ``Health`` feeds a check that brings many new entries to the
    rules in slices (``checker.slices``), so the reference before each slice is judged data
    too: a short run that arrives in one check is judged as a whole."""
    n = steps.size
    if n == 0 or last is None or steps[-1] < last:
        return 0
    return int(np.searchsorted(steps, last, side="right"))


__all__ = ["HealthInput", "HealthView", "RankColumns", "new_from"]
