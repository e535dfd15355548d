"""Is this fine-tune training? A running account of the adapters (``adapters.Adapters``): do
their weights move (LoRA's B leaves zero; the others' updates add up), do gradients reach them.

``AdapterWatch.observe(inp)`` takes what is new in a ``HealthInput`` (the measured update
steps, then the per-step gradient norms), in step order, so the sampler's watch and a rule's
watch (fed slice by slice) reach the same account; ``verdict()`` says it in one line. The
weights are read where nbmonitor already reads them (the sampled update steps: every step
early in a run), never with a step of their own.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from nbmonitor.health.adapters import Adapters
from nbmonitor.health.view import HealthInput
from nbmonitor.health.window import BoolArray, FloatArray
from nbmonitor.health.wording import num

# Measured update steps (from step FIRST_JUDGED on: the first update may run at a warm-up's
# lr 0, and LoRA's A gets no gradient while B is still zero) before "not learning" is said.
MIN_UPDATES = 10
FIRST_JUDGED = 2
# Steps of gradient norms before "no gradient" is said without update measurements.
MIN_GRAD_STEPS = 20
# Recent update ratios kept per tensor (the learning-rate judgement reads their median).
RECENT_RATIOS = 32

LEARNING = "learning"
NOT_LEARNING = "not learning"
NOT_TRAINED = "not trained"
TOO_SLOW = "too slow"
WAITING = "waiting"
RECEIVING = "receiving gradients"


@dataclass(frozen=True)
class AdapterVerdict:
    """The one-line answer (``text``) and the figures it is made of."""

    state: str  # LEARNING, NOT_LEARNING, NOT_TRAINED, TOO_SLOW, RECEIVING or WAITING
    text: str
    step: int
    method: str
    tensors: int  # adapter tensors that train
    updates: int  # measured update steps seen
    b_left_zero: int  # zero-started tensors (LoRA's B) that left zero
    b_zero_start: int
    b_norm: float  # median norm of the zero-started tensors now (NaN: none)
    moved: float  # median relative path of the others (sum of ||dw||/||w||; NaN: none)
    step_ratio: float  # median recent ||dw||/||w|| of the others (NaN: none)
    grads: str  # "non-zero", "zero", "none" or "unknown"
    grad_norm: float  # median recent non-zero adapter gradient norm (NaN: none)


class AdapterWatch:
    """The running account of one run's adapters: one entry per adapter that trains
    (``Adapters.training``), kept in arrays (a 7B model has hundreds of adapters, and a check
    reads them all)."""

    def __init__(self, adapters: Adapters, too_slow: float = 1e-6) -> None:
        self.adapters = adapters
        self.too_slow = too_slow  # a step ratio below this is an lr too small (update_ratio_low)
        self.tensors = adapters.training
        k = len(self.tensors)
        self._zero_start = np.array([t.zero_start for t in self.tensors], dtype=bool)
        self.first_norm = np.full(k, np.nan)  # each one's norm before its first measured update
        self.norm = np.full(k, np.nan)  # before the newest
        self.moved = np.zeros(k, dtype=bool)  # a measured update changed it
        self.left_zero = np.zeros(k, dtype=bool)  # it started at zero and is not any more
        self.ratio_sum = np.zeros(k)  # sum of measured ||dw||/||w|| (its path, where sampled)
        self.updates = np.zeros(k, dtype=np.intp)  # measured update steps judged
        # The recent ratios, a ring per adapter (``_filled`` of them, the next at ``_pos``).
        self._recent = np.full((k, RECENT_RATIOS), np.nan)
        self._pos = np.zeros(k, dtype=np.intp)
        self._filled = np.zeros(k, dtype=np.intp)
        self.grad_nonzero = np.zeros(k, dtype=np.intp)
        self.grad_zero = np.zeros(k, dtype=np.intp)
        self.grad_none = np.zeros(k, dtype=np.intp)
        self.grad_last = np.full(k, np.nan)  # the newest non-zero gradient norm
        self._names: tuple[str, ...] | None = None
        self._rows = np.zeros(0, dtype=np.intp)  # each adapter's row in the layer columns
        self._known = np.zeros(k, dtype=bool)  # whether it has one
        self._rest = np.zeros(0, dtype=np.intp)  # the rows of the other tracked parameters
        self._last_update = -math.inf
        self._last_grad = -math.inf
        self.step = 0
        self.grad_steps = 0
        # Whether a tracked parameter that is not an adapter had a gradient: without one, an
        # adapter with none says the loss itself is cut from the model, not the adapters.
        self.rest_grads = False

    @property
    def size(self) -> int:
        return len(self.tensors)

    def _index(self, names: tuple[str, ...]) -> None:
        if names == self._names:
            return
        self._names = names
        index = {n: i for i, n in enumerate(names)}
        rows = []
        for t in self.tensors:
            module = t.name.rsplit(".", 1)[0] if "." in t.name else "(root)"
            rows.append(index.get(t.name, index.get(module, -1)))
        self._rows = np.asarray(rows, dtype=np.intp)
        self._known = self._rows >= 0
        mine = set(rows)
        self._rest = np.asarray([i for i in range(len(names)) if i not in mine], dtype=np.intp)

    def observe(self, inp: HealthInput, until: float = math.inf) -> None:
        """Take the update steps and gradient rows of ``inp`` newer than those seen, up to
        step ``until``."""
        if not self.tensors:
            return
        self._index(inp.layer_names)
        n = len(inp.layer_names)
        rows = np.where(self._known, self._rows, 0)
        steps, ratios, norms = inp.update_steps, inp.update_series, inp.param_series
        if (
            steps is not None
            and ratios is not None
            and norms is not None
            and ratios.shape == (n, steps.size)
            and norms.shape == (n, steps.size)
        ):
            for k in np.flatnonzero((steps > self._last_update) & (steps <= until)).tolist():
                step = float(steps[k])
                self._last_update = step
                self.step = max(self.step, int(step))
                self._update(step, norms[rows, k], ratios[rows, k])
        grads, gsteps = inp.layer_grad_norms, inp.layer_steps
        if grads is not None and gsteps is not None and grads.shape == (n, gsteps.size):
            new = np.flatnonzero((gsteps > self._last_grad) & (gsteps <= until))
            if new.size:
                self._last_grad = float(gsteps[new[-1]])
                self.step = max(self.step, int(gsteps[new[-1]]))
                self.grad_steps += int(new.size)
                if not self.rest_grads and self._rest.size:
                    self.rest_grads = bool(np.isfinite(grads[self._rest][:, new]).any())
                block = np.asarray(grads[rows][:, new], dtype=np.float64)
                block[~self._known] = np.nan
                known = self._known[:, None]
                finite = np.isfinite(block)
                nonzero = finite & (block > 0)
                self.grad_none += (~finite & known).sum(axis=1)
                self.grad_zero += (finite & ~nonzero).sum(axis=1)
                self.grad_nonzero += nonzero.sum(axis=1)
                # The newest non-zero value of each row.
                last = np.where(nonzero, np.arange(new.size), -1).max(axis=1)
                has = last >= 0
                self.grad_last[has] = block[np.flatnonzero(has), last[has]]

    def _update(self, step: float, norm: FloatArray, ratio: FloatArray) -> None:
        seen = self._known & np.isfinite(norm)
        first = seen & np.isnan(self.first_norm)
        self.first_norm[first] = norm[first]
        self.moved |= seen & ~first & (norm != self.first_norm)
        zero = self._zero_start | (self.first_norm == 0.0)
        left = seen & zero & (norm > 0.0)
        self.left_zero |= left
        self.moved |= left
        self.norm[seen] = norm[seen]
        if step < FIRST_JUDGED:
            return
        self.updates += seen
        take = seen & np.isfinite(ratio) & (norm > 0.0)
        self.moved |= take & (ratio > 0.0)
        idx = np.flatnonzero(take)
        if idx.size:
            self.ratio_sum[idx] += ratio[idx]
            self._recent[idx, self._pos[idx]] = ratio[idx]
            self._pos[idx] = (self._pos[idx] + 1) % RECENT_RATIOS
            self._filled[idx] = np.minimum(self._filled[idx] + 1, RECENT_RATIOS)

    # -- the verdict --------------------------------------------------------------------------

    def zero_mask(self) -> BoolArray:
        """The adapters that started at zero (LoRA's B)."""
        mask: BoolArray = self._zero_start | (self.first_norm == 0.0)
        return mask

    def zero_roles(self) -> set[str]:
        return {t.role for t, z in zip(self.tensors, self.zero_mask().tolist(), strict=True) if z}

    def ratios_seen(self) -> int:
        """The fewest recent ratios any non-zero-started adapter with some has."""
        filled = self._filled[~self.zero_mask() & (self._filled > 0)]
        return int(filled.min()) if filled.size else 0

    def most_updates(self) -> int:
        return int(self.updates.max()) if self.updates.size else 0

    def grads(self) -> tuple[str, float]:
        """("non-zero" | "zero" | "none" | "unknown", the median newest non-zero norm)."""
        values = self.grad_last[np.isfinite(self.grad_last)].tolist()
        if values:
            return "non-zero", statistics.median(values)
        if self.grad_zero.any():
            return "zero", 0.0
        if self.grad_none.any():
            return "none", math.nan
        return "unknown", math.nan

    def learning(self) -> bool:
        """Whether the adapters move: LoRA's B left zero (any of them), or, without a
        zero-started part, any adapter changed."""
        zero = self.zero_mask()
        if zero.any():
            return bool(self.left_zero[zero].any())
        return bool(self.moved.any())

    def stuck(self) -> bool:
        """Enough seen to say the adapters do not move at all."""
        if not self.tensors or self.learning():
            return False
        if self.most_updates() >= MIN_UPDATES:
            return True
        # Without update measurements (layer_every=0): no gradient at all, for long enough.
        kind, _ = self.grads()
        return (
            self.most_updates() == 0
            and kind in ("zero", "none")
            and self.grad_steps >= MIN_GRAD_STEPS
        )

    def step_ratio(self) -> float:
        """The median of the recent ||dw||/||w|| of the non-zero-started adapters (A). An
        update of exactly 0 counts: with a gradient, it is one too small for the weights'
        precision to show (it rounds away)."""
        others = np.flatnonzero(~self.zero_mask() & (self._filled > 0))
        if not others.size:
            return math.nan
        back = np.arange(1, 9)
        cols = (self._pos[others, None] - back[None, :]) % RECENT_RATIOS
        valid = back[None, :] <= self._filled[others, None]
        values = self._recent[others[:, None], cols][valid]
        values = values[values >= 0]
        return statistics.median(values.tolist()) if values.size else math.nan

    def verdict(self) -> AdapterVerdict:
        ad = self.adapters
        zero = self.zero_mask()
        others = ~zero
        left = int(self.left_zero[zero].sum())
        b_norms = self.norm[zero & np.isfinite(self.norm)].tolist()
        b_norm = statistics.median(b_norms) if b_norms else math.nan
        paths = self.ratio_sum[others & (self.updates > 0)].tolist()
        moved = statistics.median(paths) if paths else math.nan
        ratio = self.step_ratio()
        grads, grad_norm = self.grads()
        what = ad.count(self.tensors) if self.tensors else ad.count()
        n_zero = int(zero.sum())
        if not self.tensors:
            state = NOT_TRAINED
            text = (
                f"adapters not trained: {ad.count()} ({ad.method}), none both requires grad "
                "and is in the optimizer"
            )
        elif self.stuck():
            state = NOT_LEARNING
            text = f"adapters NOT learning: {what}, " + self._stuck_detail(grads, grad_norm)
        elif self.learning() or self.moved.any():
            parts = [f"{what}"]
            if n_zero:
                label = zero_label(self.zero_roles())
                parts.append(f"{label} left zero in {left} of {n_zero} (median norm {num(b_norm)})")
            if paths:
                parts.append(f"{'A' if n_zero else 'weights'} moved {num(moved)} (relative)")
            parts.append(_grads_text(grads, grad_norm))
            slow = math.isfinite(ratio) and ratio < self.too_slow and grads == "non-zero"
            if slow:
                state = TOO_SLOW
                text = "adapters barely move: " + ", ".join(parts) + f"; step ‖Δw‖/‖w‖ {num(ratio)}"
            else:
                state = LEARNING
                text = "adapters learning: " + ", ".join(parts)
        elif grads == "non-zero" and self.grad_steps >= MIN_GRAD_STEPS:
            # The updates are not measured (layer_every=0, or a copy too large to take):
            # what is known is that gradients arrive.
            state = RECEIVING
            text = (
                f"adapters receiving gradients: {what} ({ad.method}), "
                f"{_grads_text(grads, grad_norm)}; their updates are not measured"
            )
        else:
            state = WAITING
            text = f"adapters: {what} ({ad.method}), waiting for their first updates"
        return AdapterVerdict(
            state=state,
            text=text,
            step=self.step,
            method=ad.method,
            tensors=len(self.tensors),
            updates=self.most_updates(),
            b_left_zero=left,
            b_zero_start=n_zero,
            b_norm=b_norm,
            moved=moved,
            step_ratio=ratio,
            grads=grads,
            grad_norm=grad_norm,
        )

    def _stuck_detail(self, grads: str, grad_norm: float) -> str:
        if self.zero_mask().any():
            label = zero_label(self.zero_roles())
            still = f"{label} stays at zero" if label in ("A", "B") else "still zero"
            weights = f"{still} after {self.most_updates()} measured updates"
        else:
            weights = f"weights unchanged over {self.most_updates()} measured updates"
        return f"{weights}, {_grads_text(grads, grad_norm)}"


def zero_label(roles: set[str]) -> str:
    """What the zero-started tensors are called: LoRA's B (peft's embedding LoRA starts A at
    zero instead), or "zero-started tensors" when both halves did."""
    return next(iter(roles)) if len(roles) == 1 and roles <= {"A", "B"} else "zero-started tensors"


def _grads_text(kind: str, norm: float) -> str:
    if kind == "non-zero":
        return f"grads non-zero (median {num(norm)})"
    if kind == "zero":
        return "grads exactly zero"
    if kind == "none":
        return "no gradient reaches them"
    return "grads not measured"


__all__ = [
    "LEARNING",
    "MIN_UPDATES",
    "NOT_LEARNING",
    "NOT_TRAINED",
    "RECEIVING",
    "TOO_SLOW",
    "WAITING",
    "AdapterVerdict",
    "AdapterWatch",
    "zero_label",
]
