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
from dataclasses import dataclass, field

import numpy as np

from nbmonitor.health.adapters import Adapters, AdapterTensor
from nbmonitor.health.view import HealthInput
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


@dataclass
class _Account:
    """What has been seen of one adapter tensor."""

    tensor: AdapterTensor
    first_norm: float = math.nan  # its norm before the first measured update
    norm: float = math.nan  # before the newest
    moved: bool = False  # a measured update changed it
    left_zero: bool = False  # it started at zero and is not any more
    ratio_sum: float = 0.0  # sum of measured ||dw||/||w|| (its relative path, where sampled)
    ratios: list[float] = field(default_factory=list)  # the recent ones, oldest first
    updates: int = 0  # measured update steps judged
    grad_nonzero: int = 0
    grad_zero: int = 0
    grad_none: int = 0
    grad_values: list[float] = field(default_factory=list)  # recent non-zero grad norms


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
    """The running account of one run's adapters."""

    def __init__(self, adapters: Adapters, too_slow: float = 1e-6) -> None:
        self.adapters = adapters
        self.too_slow = too_slow  # a step ratio below this is an lr too small (update_ratio_low)
        self._accounts = [_Account(t) for t in adapters.training]
        self._names: tuple[str, ...] | None = None
        self._rows: list[int] = []  # each account's row in the layer columns (-1: none)
        self._last_update = -math.inf
        self._last_grad = -math.inf
        self.step = 0
        self.grad_steps = 0
        # Whether a tracked parameter that is not an adapter had a gradient: without one, an
        # adapter with none says the loss itself is cut from the model, not the adapters.
        self.rest_grads = False
        self._rest: list[int] = []

    @property
    def accounts(self) -> list[_Account]:
        return self._accounts

    def _index(self, names: tuple[str, ...]) -> None:
        if names == self._names:
            return
        self._names = names
        index = {n: i for i, n in enumerate(names)}
        rows = []
        for a in self._accounts:
            name = a.tensor.name
            module = name.rsplit(".", 1)[0] if "." in name else "(root)"
            rows.append(index.get(name, index.get(module, -1)))
        self._rows = rows
        mine = set(rows)
        self._rest = [i for i in range(len(names)) if i not in mine]

    def observe(self, inp: HealthInput, until: float = math.inf) -> None:
        """Take the update steps and gradient rows of ``inp`` newer than those seen, up to
        step ``until``."""
        if not self._accounts:
            return
        self._index(inp.layer_names)
        rows = self._rows
        n = len(inp.layer_names)
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
                for a, row in zip(self._accounts, rows, strict=True):
                    if row >= 0:
                        self._update(a, step, float(norms[row, k]), float(ratios[row, k]))
        grads, gsteps = inp.layer_grad_norms, inp.layer_steps
        if grads is not None and gsteps is not None and grads.shape == (n, gsteps.size):
            new = np.flatnonzero((gsteps > self._last_grad) & (gsteps <= until))
            if new.size:
                self._last_grad = float(gsteps[new[-1]])
                self.step = max(self.step, int(gsteps[new[-1]]))
                self.grad_steps += int(new.size)
                if not self.rest_grads and self._rest:
                    rest = grads[np.asarray(self._rest, dtype=np.intp)][:, new]
                    self.rest_grads = bool(np.isfinite(rest).any())
                for a, row in zip(self._accounts, rows, strict=True):
                    if row < 0:
                        continue
                    values = grads[row, new]
                    finite = values[np.isfinite(values)]
                    a.grad_none += int(values.size - finite.size)
                    nonzero = finite[finite > 0]
                    a.grad_zero += int(finite.size - nonzero.size)
                    a.grad_nonzero += int(nonzero.size)
                    if nonzero.size:
                        a.grad_values = [*a.grad_values, *nonzero[-8:].tolist()][-8:]

    def _update(self, a: _Account, step: float, norm: float, ratio: float) -> None:
        if not math.isfinite(norm):
            return
        if math.isnan(a.first_norm):
            a.first_norm = norm
        elif norm != a.first_norm:
            a.moved = True
        if (a.tensor.zero_start or a.first_norm == 0.0) and norm > 0.0:
            a.left_zero = a.moved = True
        a.norm = norm
        if step < FIRST_JUDGED:
            return
        a.updates += 1
        if math.isfinite(ratio) and norm > 0.0:
            if ratio > 0.0:
                a.moved = True
            a.ratio_sum += ratio
            a.ratios = [*a.ratios, ratio][-RECENT_RATIOS:]

    # -- the verdict --------------------------------------------------------------------------

    def zero_started(self) -> list[_Account]:
        return [a for a in self._accounts if a.tensor.zero_start or a.first_norm == 0.0]

    def others(self) -> list[_Account]:
        zero = {id(a) for a in self.zero_started()}
        return [a for a in self._accounts if id(a) not in zero]

    def updates(self) -> int:
        return max((a.updates for a in self._accounts), default=0)

    def grads(self) -> tuple[str, float]:
        """("non-zero" | "zero" | "none" | "unknown", the median recent non-zero norm)."""
        values = [v for a in self._accounts for v in a.grad_values]
        if values:
            return "non-zero", statistics.median(values)
        if any(a.grad_zero for a in self._accounts):
            return "zero", 0.0
        if any(a.grad_none for a in self._accounts):
            return "none", math.nan
        return "unknown", math.nan

    def learning(self) -> bool:
        """Whether the adapters move: LoRA's B left zero (any of them), or, without a
        zero-started part, any adapter changed."""
        zero = self.zero_started()
        if zero:
            return any(a.left_zero for a in zero)
        return any(a.moved for a in self._accounts)

    def stuck(self) -> bool:
        """Enough seen to say the adapters do not move at all."""
        if not self._accounts or self.learning():
            return False
        if self.updates() >= MIN_UPDATES:
            return True
        # Without update measurements (layer_every=0): no gradient at all, for long enough.
        kind, _ = self.grads()
        return (
            self.updates() == 0 and kind in ("zero", "none") and self.grad_steps >= MIN_GRAD_STEPS
        )

    def step_ratio(self) -> float:
        """The median of the recent ||dw||/||w|| of the non-zero-started adapters (A). An
        update of exactly 0 counts: with a gradient, it is one too small for the weights'
        precision to show (it rounds away)."""
        values = [r for a in self.others() for r in a.ratios[-8:] if r >= 0]
        return statistics.median(values) if values else math.nan

    def verdict(self) -> AdapterVerdict:
        ad = self.adapters
        training = self._accounts
        zero = self.zero_started()
        others = self.others()
        left = sum(a.left_zero for a in zero)
        b_norms = [a.norm for a in zero if math.isfinite(a.norm)]
        b_norm = statistics.median(b_norms) if b_norms else math.nan
        paths = [a.ratio_sum for a in others if a.updates]
        moved = statistics.median(paths) if paths else math.nan
        ratio = self.step_ratio()
        grads, grad_norm = self.grads()
        what = ad.count(tuple(a.tensor for a in training)) if training else ad.count()
        if not training:
            state = NOT_TRAINED
            text = (
                f"adapters not trained: {ad.count()} ({ad.method}), none both requires grad "
                "and is in the optimizer"
            )
        elif self.stuck():
            state = NOT_LEARNING
            text = f"adapters NOT learning: {what}, " + self._stuck_detail(grads, grad_norm)
        elif self.learning() or any(a.moved for a in training):
            parts = [f"{what}"]
            if zero:
                b = zero_label(zero)
                parts.append(f"{b} left zero in {left} of {len(zero)} (median norm {num(b_norm)})")
            if paths:
                parts.append(f"{'A' if zero else 'weights'} moved {num(moved)} (relative)")
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
            tensors=len(training),
            updates=self.updates(),
            b_left_zero=left,
            b_zero_start=len(zero),
            b_norm=b_norm,
            moved=moved,
            step_ratio=ratio,
            grads=grads,
            grad_norm=grad_norm,
        )

    def _stuck_detail(self, grads: str, grad_norm: float) -> str:
        zero = self.zero_started()
        if zero:
            label = zero_label(zero)
            still = f"{label} stays at zero" if label in ("A", "B") else "still zero"
            weights = f"{still} after {self.updates()} measured updates"
        else:
            weights = f"weights unchanged over {self.updates()} measured updates"
        return f"{weights}, {_grads_text(grads, grad_norm)}"


def zero_label(zero: list[_Account]) -> str:
    """What the zero-started tensors are called: LoRA's B (peft's embedding LoRA starts A at
    zero instead), or "zero-started tensors" when both halves did."""
    roles = {a.tensor.role for a in zero}
    return roles.pop() if len(roles) == 1 and roles <= {"A", "B"} else "zero-started tensors"


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
