"""Per-layer statistics on the sampler side: bounded recent window + whole-run heatmap.

The hooks hand over per-parameter gradient norms every step (and, every ``layer_every`` steps,
parameter and update norms). Here they are grouped into layers (a parameter each, or a module
each), kept for the health rules (the last ``recent`` steps at full resolution) and for the
heatmap (at most ``columns`` columns over the whole run, each the max over its steps, so a spike
is never averaged away). Memory is ``layers x (recent + columns)`` floats however long the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import LayerFrame
from nbmonitor._engine.tiering import first, merge_pairs
from nbmonitor.health.adapters import Adapters

FloatArray = npt.NDArray[np.float64]

GROUPINGS = ("param", "module")
# Measured steps of update ratios kept for the health rules (they judge each in step order).
UPDATE_HISTORY = 64


@dataclass(frozen=True)
class ParamInfo:
    name: str
    shape: tuple[int, ...]
    numel: int
    dtype: str
    device: str
    requires_grad: bool
    in_optimizer: bool


def module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else "(root)"


def _static_row(name: str, members: Sequence[ParamInfo]) -> dict[str, object]:
    """The part of a layer's table row that its parameters fix."""
    first = members[0]
    return {
        "name": name,
        "shape": first.shape if len(members) == 1 else f"{len(members)} tensors",
        "numel": sum(p.numel for p in members),
        "dtype": first.dtype,
        "device": first.device,
        "requires_grad": any(p.requires_grad for p in members),
        "in_optimizer": all(p.in_optimizer for p in members),
    }


@dataclass(frozen=True)
class LayerTable:
    """The layer table as of one moment, made into rows only when read (``rows``): the
    sampler publishes one at every health check for ``mon.layers()``, which is seldom read.
    Its arrays are copies, never written."""

    fixed: tuple[dict[str, object], ...]  # per layer, what its parameters fix
    grad_norm: FloatArray
    param_norm: FloatArray
    update_ratio: FloatArray
    flags: Mapping[str, tuple[str, ...]]  # per layer, the rules that named it, sorted

    def rows(self) -> list[dict[str, object]]:
        """One dict per layer for ``mon.layers()`` and the dashboard table."""
        flags = self.flags
        rows: list[dict[str, object]] = []
        for fixed, grad, norm, ratio in zip(
            self.fixed,
            self.grad_norm.tolist(),
            self.param_norm.tolist(),
            self.update_ratio.tolist(),
            strict=True,
        ):
            row = fixed.copy()  # a copy and four stores: half the time of {**fixed, ...}
            row["grad_norm"] = grad
            row["param_norm"] = norm
            row["update_ratio"] = ratio
            row["flags"] = list(flags.get(str(fixed["name"]), ())) if flags else []
            rows.append(row)
        return rows


class LayerStats:
    """Per-layer gradient norms, parameter norms and update ratios of one run."""

    def __init__(
        self,
        params: Sequence[ParamInfo],
        group_by: str = "param",
        recent: int = 512,
        columns: int = 128,
    ) -> None:
        self.params = list(params)
        self.group_by = group_by
        if group_by == "module":
            names: list[str] = []
            for p in self.params:
                if module_of(p.name) not in names:
                    names.append(module_of(p.name))
        else:
            names = [p.name for p in self.params]
        self.names: tuple[str, ...] = tuple(names)
        position = {n: i for i, n in enumerate(self.names)}
        key = module_of if group_by == "module" else (lambda n: n)
        # Row i of the (layers x params) 0/1 matrix sums the squares of layer i's parameters.
        self._group = np.zeros((len(self.names), len(self.params)))
        members: list[list[ParamInfo]] = [[] for _ in self.names]
        for j, p in enumerate(self.params):
            self._group[position[key(p.name)], j] = 1.0
            members[position[key(p.name)]].append(p)
        # What the table says of each layer that never changes (its parameters are fixed at
        # attach): built once, not per table (a table a tick, of hundreds of layers).
        self._static_rows = tuple(
            _static_row(name, m) for name, m in zip(self.names, members, strict=True)
        )
        # The last table and what it was built from (``table``).
        self._table_key: tuple[object, ...] | None = None
        self._table: tuple[dict[str, object], ...] = ()
        n_layers = len(self.names)
        self._recent = recent
        self._recent_norms = np.full((n_layers, recent), np.nan)
        self._recent_steps = np.full(recent, np.nan)
        self._count = 0
        self._columns = columns
        self._heat = np.full((n_layers, columns), np.nan)
        self._heat_steps = np.full(columns, np.nan)
        self._heat_used = 0
        self._width = 1
        self._in_bucket = 0
        self.seen = np.zeros(len(self.params), dtype=bool)
        self.latest_grad = np.full(n_layers, np.nan)
        self.param_norm = np.full(n_layers, np.nan)
        self.update_ratio = np.full(n_layers, np.nan)
        self.last_step = 0
        self.activations: dict[str, dict[str, float]] = {}
        # What each module is ("3" -> "Linear"), for the health rules' wording.
        self.module_kinds: dict[str, str] = {}
        # The adapters of a fine-tune (read at attach; a run on disk: from meta.json), or None.
        self.adapters: Adapters | None = None
        # The update ratios of the last UPDATE_HISTORY measured steps, for the health rules.
        self._update_steps = np.full(UPDATE_HISTORY, np.nan)
        self._update_ratios = np.full((n_layers, UPDATE_HISTORY), np.nan)
        self._update_params = np.full((n_layers, UPDATE_HISTORY), np.nan)
        self._updates = 0
        # The first module with a non-finite output since gradients were last finite: the one
        # a non-finite gradient report names. One entry, so a long NaN run stays bounded.
        self.first_bad_forward: tuple[int, str, tuple[float, float, float]] | None = None

    # -- input ---------------------------------------------------------------------------------

    def _group_norms(self, per_param: FloatArray) -> FloatArray:
        """Layer norms from parameter norms; works on one vector or on rows (steps x params)."""
        if self.group_by == "param":
            return per_param
        squares = np.where(np.isnan(per_param), 0.0, per_param**2)
        # A module whose parameters all lack a gradient stays NaN rather than reading 0.
        has = (~np.isnan(per_param)).astype(np.float64) @ self._group.T > 0
        out = np.sqrt(squares @ self._group.T)
        out[~has] = np.nan
        return out

    def add_grad_norms(self, step: int, norms: FloatArray, index: tuple[int, ...] | None) -> None:
        """Take one step's per-parameter norms (``index``: which parameters, None = all)."""
        self.add_grad_norm_rows([step], np.asarray(norms, dtype=np.float64)[None, :], index)

    def add_grad_norm_rows(
        self, steps: Sequence[int], norms: FloatArray, index: tuple[int, ...] | None
    ) -> None:
        """Take consecutive steps' per-parameter norms at once, one row per step (a tick
        brings tens of steps; one numpy pass over all of them keeps the sampler cheap)."""
        k = len(steps)
        if k == 0:
            return
        per_param = np.full((k, len(self.params)), np.nan)
        if index is None:
            per_param[:, : norms.shape[1]] = norms
        else:
            per_param[:, list(index)] = norms
        self.seen |= ~np.isnan(per_param).all(axis=0)
        step_arr = np.asarray(steps, dtype=np.float64)
        bad_forward = self.first_bad_forward
        if bad_forward is not None:
            finite = np.isfinite(norms).all(axis=1)
            if np.any(finite & (step_arr >= bad_forward[0])):
                self.first_bad_forward = None  # gradients are finite again: episode over
        layer = self._group_norms(per_param)
        self.latest_grad = layer[-1].copy()
        self.last_step = int(steps[-1])
        keep = min(k, self._recent)
        slots = (self._count + np.arange(k - keep, k)) % self._recent
        self._recent_norms[:, slots] = layer[k - keep :].T
        self._recent_steps[slots] = step_arr[k - keep :]
        self._count += k
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log10(layer)
        logs[~np.isfinite(logs)] = np.nan
        self._add_heat(step_arr, logs)

    def _add_heat(self, steps: FloatArray, logs: FloatArray) -> None:
        """Max-merge rows of log10 norms into heatmap columns of ``_width`` steps each: the
        open column first, then as many new columns as fit before the heatmap is full, in
        one ``reduceat`` (a tick brings tens of rows: one call, not one per column)."""
        r, k = 0, len(steps)
        while r < k:
            if self._in_bucket == 0:
                if self._heat_used == self._columns:
                    self._merge_pairs()
                width, used = self._width, self._heat_used
                rows = min(k - r, (self._columns - used) * width)
                starts = np.arange(0, rows, width)
                n = starts.size
                self._heat[:, used : used + n] = np.fmax.reduceat(logs[r : r + rows], starts).T
                self._heat_steps[used : used + n] = steps[r + starts]
                self._heat_used += n
                self._in_bucket = rows % width
                r += rows
            else:
                take = min(self._width - self._in_bucket, k - r)
                col = self._heat_used - 1
                chunk = np.fmax.reduce(logs[r : r + take], axis=0)
                self._heat[:, col] = np.fmax(self._heat[:, col], chunk)
                self._in_bucket = (self._in_bucket + take) % self._width
                r += take

    def _merge_pairs(self) -> None:
        used = self._heat_used
        merge_pairs(self._heat, used, np.fmax, np.nan)
        self._heat_used = merge_pairs(self._heat_steps, used, first, np.nan)
        self._width *= 2

    def set_param_norms(self, values: Sequence[float]) -> None:
        """Parameter norms of every tracked parameter (taken once at attach)."""
        self.param_norm = self._group_norms(np.asarray(values, dtype=np.float64))

    def set_newest(
        self, param_norm: Mapping[int, float], update_ratio: Mapping[int, float]
    ) -> None:
        """The newest parameter norm and update ratio of some layers, by layer index (a run
        read from disk: its layer rows' last finite values); the others keep theirs."""
        for index, value in param_norm.items():
            self.param_norm[index] = value
        for index, value in update_ratio.items():
            self.update_ratio[index] = value

    def add_update(self, values: Sequence[float], step: int | None = None) -> None:
        """Parameter norms then update norms of the optimizer's parameters (one sampled step,
        ``step`` when known)."""
        n = len(values) // 2
        pn = np.full(len(self.params), np.nan)
        dn = np.full(len(self.params), np.nan)
        pn[:n] = values[:n]
        dn[:n] = values[n:]
        pn_l, dn_l = self._group_norms(pn), self._group_norms(dn)
        known = ~np.isnan(pn_l)
        self.param_norm = np.where(known, pn_l, self.param_norm)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            self.update_ratio = np.where(pn_l > 0, dn_l / pn_l, np.nan)
        if step is not None:
            slot = self._updates % UPDATE_HISTORY
            self._update_steps[slot] = step
            self._update_ratios[:, slot] = self.update_ratio
            self._update_params[:, slot] = self.param_norm
            self._updates += 1

    def update_history(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(steps, layers x steps update ratios, layers x steps parameter norms) of the recent
        measured steps, oldest first."""
        n = min(self._updates, UPDATE_HISTORY)
        order = (self._updates - n + np.arange(n)) % UPDATE_HISTORY
        return (
            self._update_steps[order],
            self._update_ratios[:, order],
            self._update_params[:, order],
        )

    def add_forward(self, step: int, names: Sequence[str], values: Sequence[float]) -> None:
        rows = np.asarray(values, dtype=np.float64).reshape(len(names), 4)
        bad = np.flatnonzero(rows[:, 0] > 0)
        if bad.size and self.first_bad_forward is None:
            first = int(bad[0])
            mean, std, maxabs = (float(v) for v in rows[first, 1:])
            self.first_bad_forward = (step, names[first], (mean, std, maxabs))

    def add_activations(self, names: Sequence[str], values: Sequence[float]) -> None:
        rows = np.asarray(values, dtype=np.float64).reshape(len(names), 4)
        self.activations = {
            name: {"mean": r[0], "std": r[1], "max_abs": r[2], "zero_frac": r[3]}
            for name, r in zip(names, rows.tolist(), strict=True)
        }

    # -- output --------------------------------------------------------------------------------

    def recent(self) -> tuple[FloatArray, FloatArray]:
        """(steps, layers x steps grad norms) of the recent window, oldest first."""
        if self._count <= self._recent:
            n = self._count
            return self._recent_steps[:n].copy(), self._recent_norms[:, :n].copy()
        # The ring is full: the oldest entry is the next slot to be written.
        slot = self._count % self._recent
        steps = np.concatenate((self._recent_steps[slot:], self._recent_steps[:slot]))
        norms = np.concatenate((self._recent_norms[:, slot:], self._recent_norms[:, :slot]), axis=1)
        return steps, norms

    def peak_since(self, step: float) -> tuple[float, FloatArray] | None:
        """Of the recent window's steps after ``step``: the newest, and each layer's largest
        gradient norm over them (NaN where none); None if none is newer. Reads only those
        steps' columns (``recent()`` copies the whole window)."""
        n = min(self._count, self._recent)
        order = (self._count - n + np.arange(n)) % self._recent  # oldest first
        new = order[self._recent_steps[order] > step]
        if not new.size:
            return None
        with np.errstate(invalid="ignore"):
            peak = np.fmax.reduce(self._recent_norms[:, new], axis=1)
        return float(self._recent_steps[new[-1]]), peak

    def heatmap(self) -> tuple[FloatArray, FloatArray]:
        """(steps, layers x columns log10 grad norm) over the whole run, NaN where unknown."""
        used = self._heat_used
        return self._heat_steps[:used].copy(), self._heat[:, :used].copy()

    def snapshot(self, flags: Mapping[str, Sequence[str]] | None = None) -> LayerTable:
        """The table as it is now (``flags``: per layer, the rules whose alerts named it),
        its rows not made yet."""
        return LayerTable(
            self._static_rows,
            self.latest_grad.copy(),
            self.param_norm.copy(),
            self.update_ratio.copy(),
            {name: tuple(sorted(set(rules))) for name, rules in (flags or {}).items()},
        )

    def table(self, flags: Mapping[str, Sequence[str]] | None = None) -> list[dict[str, object]]:
        """One dict per layer for ``mon.layers()`` and the dashboard table (``flags``: per
        layer, the rules whose alerts named it).

        The rows are read-only and shared: they are made again only when one of the live
        numbers or flags changed since the last table (compared by value, so a reader that
        wrote into the arrays, as a run read from disk does, is seen too), from rows whose
        fixed part was made once."""
        now = self.snapshot(flags)
        key = (
            now.grad_norm.tobytes(),
            now.param_norm.tobytes(),
            now.update_ratio.tobytes(),
            tuple(sorted(now.flags.items())),
        )
        if key != self._table_key:
            self._table = tuple(now.rows())
            self._table_key = key
        return list(self._table)

    def frame(self, flags: Mapping[str, Sequence[str]] | None = None) -> LayerFrame:
        steps, heat = self.heatmap()
        return LayerFrame(
            names=self.names,
            steps=steps,
            log10_grad_norm=heat,
            table=tuple(self.table(flags)),
        )
