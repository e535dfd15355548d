"""Training-health rules: plain-language diagnoses of what is going wrong, and where.

``Health.check`` runs on the sampler thread (paced to about 0.1 % of a core, so every few ticks)
over the recent per-step columns and the per-layer arrays, so every rule is a handful of
vectorised numpy operations over a window of a few hundred steps x a few hundred layers;
nothing here imports torch.

A rule *holds* for a set of subjects (a layer name, a module name, a GPU, or ``""`` for the
whole run). An alert is raised when a subject starts to hold and not again while it keeps
holding; it is re-armed only once the rule has been judged clear for that subject for
``rearm_steps`` steps. Keying by single subject rather than by the whole layer set means a set
that grows or shrinks by one layer (noise around a threshold) does not raise a new alert for the
layers already reported.

Rules only judge *new* data (steps and layer columns after the previous check), compared with a
reference window of the steps before them; with no new data nothing is judged, so a paused run
neither raises nor clears anything.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import Alert, name_list
from nbmonitor.backends import device_health

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.intp]

# Layer lists longer than this are cut in messages ("and 12 more"); Alert.layers keeps them all.
# A NaN in a column is ambiguous (not logged that step, or logged as NaN); a NaN counts as a
# non-finite value only when the column was filled on this fraction of at least DENSE_MIN_ROWS
# preceding rows, i.e. the value is logged every step.
DENSE_FRACTION = 0.9
DENSE_MIN_ROWS = 8
# Robust spread (median absolute deviation scaled to a Gaussian sigma) a loss spike must also
# exceed, so that a loss with a tight noise band is judged by its noise, not only its level.
SPIKE_SIGMAS = 6.0
MAD_TO_SIGMA = 1.4826
# Logged losses (the first ones seen) that set the starting level for the plateau rule.
START_LOSSES = 10
TOTAL = "<total>"  # subject of the total grad norm in exploding_gradients (not a layer name)
_DEVICE_SUBJECT = re.compile(r"^(GPU \d+|MPS)\b")


@dataclass(frozen=True)
class Thresholds:
    """When each rule fires. Defaults are chosen to stay silent on healthy training."""

    explode_factor: float = 10.0  # layer (or total) grad norm > factor x its running median
    explode_abs: float | None = None  # or above this absolute value
    vanish_ratio: float = 1e-7  # layer grad norm / param norm below this ...
    vanish_steps: int = 20  # ... for this many consecutive recorded steps
    update_ratio_high: float = 1e-1  # ||dw||/||w|| above this: LR too high (healthy ~1e-3)
    update_ratio_low: float = 1e-6  # below this: LR too low, or not really training
    spike_factor: float = 5.0  # loss > factor x the median of the recent window
    spike_range_fraction: float = 0.1  # ... and up by this fraction of the run's loss range
    plateau_window: int = 200  # loss not decreasing over this many steps
    plateau_tolerance: float = 0.01  # relative decrease (last vs first quarter) that counts
    plateau_progress: float = 0.5  # ... and improved by less than this fraction since the start
    dead_fraction: float = 0.99  # activations: fraction of exact zeros at or above this
    window: int = 100  # recent steps used by the running medians
    min_history: int = 20  # steps of reference before median-based rules judge anything
    rearm_steps: int = 100  # steps a condition must stay clear before it can alert again
    sustain_steps: int = 3  # explosions, spikes and update ratios must last this many steps
    temperature_c: float = device_health.TEMPERATURE_C
    memory_fraction: float = device_health.MEMORY_FRACTION
    idle_util_percent: float = device_health.IDLE_UTIL_PERCENT

    def __post_init__(self) -> None:
        positive = {
            "explode_factor": self.explode_factor,
            "vanish_ratio": self.vanish_ratio,
            "update_ratio_high": self.update_ratio_high,
            "update_ratio_low": self.update_ratio_low,
            "spike_factor": self.spike_factor,
        }
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Thresholds.{name} must be a finite number > 0, got {value!r}.")
        counts = {
            "vanish_steps": self.vanish_steps,
            "plateau_window": self.plateau_window,
            "window": self.window,
            "min_history": self.min_history,
            "sustain_steps": self.sustain_steps,
        }
        for name, count in counts.items():
            if count < 1:
                raise ValueError(f"Thresholds.{name} must be at least 1, got {count!r}.")
        if self.plateau_window < 8:
            raise ValueError(
                f"Thresholds.plateau_window must be at least 8 (it compares quarters), "
                f"got {self.plateau_window!r}."
            )
        if self.rearm_steps < 0:
            raise ValueError(f"Thresholds.rearm_steps must be >= 0, got {self.rearm_steps!r}.")
        if not 0 < self.dead_fraction <= 1:
            raise ValueError(
                f"Thresholds.dead_fraction must be in (0, 1], got {self.dead_fraction!r}."
            )


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


@dataclass(frozen=True)
class _Outcome:
    """One rule's verdict on the new data."""

    rule: str
    held: Sequence[str]  # subjects for which the rule holds now
    judged: Callable[[str], bool]  # whether a subject was judged (held or clear) this time
    make: Callable[[list[str]], list[Alert]]  # alerts for the subjects that newly hold


def _never(_: str) -> bool:
    return False


def _always(_: str) -> bool:
    return True


def _nothing(rule: str) -> _Outcome:
    return _Outcome(rule, (), _never, lambda _new: [])


def _finite_or_nan(a: FloatArray) -> FloatArray:
    return np.where(np.isfinite(a), a, np.nan)


def _row_medians(a: FloatArray) -> tuple[FloatArray, IntArray]:
    """Median of the finite values of each row of a 2-D array, and how many there were.

    Written out (sort, NaN last) instead of ``np.nanmedian``, which warns on all-NaN rows: the
    test suite treats warnings as errors and ``warnings.catch_warnings`` is not thread-safe.
    """
    clean = _finite_or_nan(a)
    count = np.isfinite(clean).sum(axis=1)
    if clean.shape[1] == 0:
        return np.full(clean.shape[0], np.nan), count
    ordered = np.sort(clean, axis=1)
    lo = np.maximum((count - 1) // 2, 0)[:, None]
    hi = np.maximum(count // 2, 0)[:, None]
    hi = np.minimum(hi, clean.shape[1] - 1)
    median = 0.5 * (
        np.take_along_axis(ordered, lo, axis=1)[:, 0]
        + np.take_along_axis(ordered, hi, axis=1)[:, 0]
    )
    return np.where(count > 0, median, np.nan), count


def _row_max(a: FloatArray) -> tuple[FloatArray, IntArray]:
    """Largest finite value of each row (NaN if none) and its column."""
    if a.shape[1] == 0:
        return np.full(a.shape[0], np.nan), np.zeros(a.shape[0], dtype=np.intp)
    finite = np.isfinite(a)
    where = np.argmax(np.where(finite, a, -np.inf), axis=1)
    value = np.take_along_axis(a, where[:, None], axis=1)[:, 0]
    return np.where(finite.any(axis=1), value, np.nan), where


def _sustained(a: FloatArray, start: int, m: int) -> tuple[FloatArray, IntArray]:
    """Per row, the largest level held for ``m`` consecutive columns among windows that end at
    or after column ``start``, and the column where that window begins.

    Small batches give heavy-tailed per-step losses and gradient norms (one batch 20x the
    median is normal with batch size 4): a single step says little, a run of steps does.
    A NaN inside a window breaks it.
    """
    lo = max(0, start - (m - 1))
    seg = a[:, lo:]
    rows = a.shape[0]
    if seg.shape[1] < m:
        return np.full(rows, np.nan), np.zeros(rows, dtype=np.intp)
    mins = np.lib.stride_tricks.sliding_window_view(seg, m, axis=1).min(axis=2)
    value, where = _row_max(mins)
    return value, where + lo


def _dense(values: FloatArray) -> bool:
    """Whether a column is filled (finite or infinite, not NaN) on nearly every row."""
    return values.size >= DENSE_MIN_ROWS and bool(np.mean(~np.isnan(values)) >= DENSE_FRACTION)


def _g(value: float) -> str:
    return f"{value:.2g}" if 1e-2 <= abs(value) < 1e3 else f"{value:.1e}"


class _View:
    """Index bookkeeping for one check: which rows and layer columns are new, and the
    reference window before them."""

    def __init__(
        self, inp: HealthInput, last_step: float | None, last_layer_step: float | None, window: int
    ) -> None:
        self.inp = inp
        step_col = inp.steps.get("step")
        self.step_col = (
            np.asarray(step_col, dtype=np.float64) if step_col is not None else np.empty(0)
        )
        n = self.step_col.size
        self.new_from = _new_from(self.step_col, last_step)
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
            self.layer_new_from = _new_from(self.layer_step_col, last_layer_step)
        self.layer_ref_from = max(0, self.layer_new_from - window)
        self.has_new_layers = self.layer_new_from < self.layer_step_col.size
        self._index: dict[str, int] | None = None

    def column(self, key: str) -> FloatArray | None:
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


def _new_from(steps: FloatArray, last: float | None) -> int:
    """Index of the first entry after ``last``; keeps at least half the entries as reference.

    On the first check only the newest entry counts as new: the rest is history to compare
    with (tests and a late attach both start with a full window).
    """
    n = steps.size
    if n == 0:
        return 0
    if last is None or steps[-1] < last:  # first check, or the columns were restarted
        return n - 1
    first_new = int(np.searchsorted(steps, last, side="right"))
    if first_new >= n:
        return n
    return max(first_new, n // 2)


def non_finite_gradients(
    step: int,
    time: float,
    bad: Sequence[str],
    forward: tuple[int, str, tuple[float, float, float]] | None = None,
    forward_checked: bool = False,
) -> Alert:
    """The ``grad_non_finite`` alert: which parameters' gradients went NaN/Inf at ``step``.

    The engine detects this exactly, per step, from the raw gradient norms (here a NaN cannot
    be told from "no gradient", so there is no window rule for it); this only words it.
    ``forward`` is the first module whose output was non-finite (step, name, input mean, std
    and max |x|) when ``check_forward`` is on.
    """
    message = f"Gradients became NaN/Inf at step {step}, first in {name_list(bad) or 'unknown'}."
    if forward is not None:
        f_step, module, (mean, std, maxabs) = forward
        message += (
            f" The first module with a non-finite output was {module!r} at step {f_step} "
            f"(input mean {mean:.3g}, std {std:.3g}, max |x| {maxabs:.3g})."
        )
    elif forward_checked:
        message += (
            " Every module's forward output was finite, so the overflow happened after the"
            " model (in the loss) or in the backward pass: lower the learning rate or clip"
            " gradients."
        )
    else:
        message += (
            " Lower the learning rate, clip gradients, or check the inputs"
            " (attach(..., check_forward=True) names the first bad module)."
        )
    return Alert("grad_non_finite", "error", message, step, time, tuple(bad))


class Health:
    """Stateful alert rules over a monitor's recent data; one instance per monitor.

    >>> health = Health(Thresholds(explode_abs=1e3))  # doctest: +SKIP
    >>> for alert in health.check(inp): ...  # doctest: +SKIP
    """

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds if thresholds is not None else Thresholds()
        self._last_step: float | None = None
        self._last_layer_step: float | None = None
        # (rule, subject) -> step from which it has been judged clear (None while it holds)
        self._active: dict[tuple[str, str], int | None] = {}
        self._start_losses: list[float] = []
        self._ratio_names: tuple[str, ...] | None = None
        self._ratio_prev: FloatArray | None = None
        self._high_streak = np.zeros(0, dtype=np.intp)
        self._low_streak = np.zeros(0, dtype=np.intp)
        # Run-wide extremes: an explosion is a new maximum, a spike a real share of the range.
        self._total_max = -math.inf
        self._layer_max: FloatArray | None = None
        self._loss_lo = math.inf
        self._loss_hi = -math.inf

    def check(self, inp: HealthInput) -> list[Alert]:
        """Judge the data that arrived since the last call; return only the NEW alerts."""
        t = self.thresholds
        view = _View(inp, self._last_step, self._last_layer_step, t.window)
        self._note_start_loss(view)
        outcomes = [
            self._loss_non_finite(view),
            self._exploding(view),
            self._vanishing(view),
            *self._update_ratios(view),
            self._loss_spike(view),
            self._loss_plateau(view),
            self._dead_units(view),
            *self._device(view),
        ]
        alerts: list[Alert] = []
        for outcome in outcomes:
            alerts.extend(self._settle(outcome, inp.step))
        if view.step_col.size:
            self._last_step = float(view.step_col[-1])
        if view.layer_step_col.size:
            self._last_layer_step = float(view.layer_step_col[-1])
        return alerts

    def reset(self) -> None:
        """Forget what was reported (every condition alerts again)."""
        self._active.clear()
        self._last_step = None
        self._last_layer_step = None
        self._start_losses.clear()
        self._ratio_names = None
        self._total_max = -math.inf
        self._layer_max = None
        self._loss_lo, self._loss_hi = math.inf, -math.inf

    def _settle(self, outcome: _Outcome, step: int) -> list[Alert]:
        rule = outcome.rule
        held = set(outcome.held)
        new = [s for s in outcome.held if (rule, s) not in self._active]
        for subject in held:
            self._active[(rule, subject)] = None
        for key, clear_since in list(self._active.items()):
            if key[0] != rule or key[1] in held or not outcome.judged(key[1]):
                continue
            since = step if clear_since is None else clear_since
            if step - since >= self.thresholds.rearm_steps:
                del self._active[key]
            else:
                self._active[key] = since
        return outcome.make(new) if new else []

    # -- loss and total gradient ------------------------------------------------------------

    def _first_non_finite_row(self, view: _View, values: FloatArray) -> int | None:
        """First new row whose value is Inf, or NaN in a column logged every step."""
        new = values[view.new_from :]
        bad = np.isinf(new)
        if _dense(values[view.ref_from : view.new_from]):
            bad |= np.isnan(new)
        hits = np.flatnonzero(bad)
        return view.new_from + int(hits[0]) if hits.size else None

    def _loss_non_finite(self, view: _View) -> _Outcome:
        rule = "loss_non_finite"
        loss = view.column("loss")
        if loss is None or not view.has_new_rows:
            return _nothing(rule)
        row = self._first_non_finite_row(view, loss)
        # Clear only on positive evidence: a finite loss among the new rows.
        seen_finite = bool(np.isfinite(loss[view.new_from :]).any())
        judged = _always if (row is not None or seen_finite) else _never
        if row is None:
            return _Outcome(rule, (), judged, lambda _new: [])
        step = float(view.step_col[row])
        value = float(loss[row])

        def make(_new: list[str]) -> list[Alert]:
            return [
                Alert(
                    rule,
                    "error",
                    f"Loss is {value} at step {int(step)}: training has diverged or the batch "
                    "has bad values. Lower the learning rate, clip gradients, check the inputs "
                    "and labels for NaN/Inf, and avoid log(0) or division by zero in the loss.",
                    int(step),
                    view.time_at(step),
                )
            ]

        return _Outcome(rule, ("",), judged, make)

    # -- per-layer gradients ----------------------------------------------------------------

    def _exploding(self, view: _View) -> _Outcome:
        rule = "exploding_gradients"
        t = self.thresholds
        held: list[str] = []
        judged_total = False
        # subject -> (value, factor over the median or NaN, step)
        detail: dict[str, tuple[float, float, float]] = {}

        total = view.column("grad_norm")
        if total is not None and view.has_new_rows:
            ref = total[None, view.ref_from : view.new_from]
            value, where = _sustained(total[None, :], view.new_from, t.sustain_steps)
            # The run's maximum before the sustained window that is being judged.
            seen = _finite_or_nan(total[: max(0, view.new_from - t.sustain_steps + 1)])
            if np.isfinite(seen).any():
                self._total_max = max(self._total_max, float(np.nanmax(seen)))
            at = view.step_col[where] if view.step_col.size else np.zeros(1)
            verdict = self._explodes(ref, value, np.array([self._total_max]), at)
            if verdict is not None:
                is_judged, is_held, ratio = verdict
                judged_total = bool(is_judged[0])
                if is_held[0]:
                    held.append(TOTAL)
                    step = view.step_col[int(where[0])]
                    detail[TOTAL] = (float(value[0]), float(ratio[0]), float(step))

        layer_judged: Callable[[str], bool] = _never
        grads = view.grads
        if grads is not None and view.has_new_layers:
            ref = grads[:, view.layer_ref_from : view.layer_new_from]
            value, where = _sustained(grads, view.layer_new_from, t.sustain_steps)
            if self._layer_max is None or self._layer_max.shape[0] != grads.shape[0]:
                self._layer_max = np.full(grads.shape[0], -np.inf)
            old = _finite_or_nan(grads[:, : max(0, view.layer_new_from - t.sustain_steps + 1)])
            if old.shape[1]:
                seen_max, _ = _row_max(old)
                self._layer_max = np.fmax(self._layer_max, seen_max)
            verdict = self._explodes(ref, value, self._layer_max, view.layer_step_col[where])
            if verdict is not None:
                is_judged, is_held, ratio = verdict
                layer_judged = view.layer_judged(is_judged)
                steps = view.layer_step_col[where]
                for i in np.flatnonzero(is_held):
                    name = view.layer_names[i]
                    held.append(name)
                    detail[name] = (float(value[i]), float(ratio[i]), float(steps[i]))

        def judged(subject: str) -> bool:
            return judged_total if subject == TOTAL else layer_judged(subject)

        def make(new: list[str]) -> list[Alert]:
            layers = [s for s in new if s != TOTAL]
            worst = max(new, key=lambda s: (detail[s][1], detail[s][0]))
            value, ratio, step = detail[worst]
            how = (
                f"{ratio:.0f}x its recent median"
                if math.isfinite(ratio) and ratio > t.explode_factor
                else f"above the limit {_g(t.explode_abs or math.nan)}"
            )
            what = (
                f"Gradients exploding in {name_list(layers)} (grad norm {_g(value)}, {how})"
                if layers
                else f"Total gradient norm exploding ({_g(value)}, {how})"
            )
            return [
                Alert(
                    rule,
                    "warning",
                    f"{what} at step {int(step)}. Lower the learning rate or clip gradients "
                    "(torch.nn.utils.clip_grad_norm_).",
                    int(step),
                    view.time_at(step),
                    tuple(layers),
                )
            ]

        return _Outcome(rule, held, judged, make)

    def _explodes(
        self, ref: FloatArray, value: FloatArray, run_max: FloatArray, step: FloatArray
    ) -> tuple[BoolArray, BoolArray, FloatArray] | None:
        """Which rows were judged, which rows' newest maximum is an explosion, and by what
        factor of their running median.

        Relative to the median alone, gradients that rise during learning-rate warm-up, or
        fluctuate around a converged minimum, read as explosions; a real explosion also
        beats everything the layer has seen, and starts once the run is a full window old
        (``step`` is where each row's sustained window begins).
        """
        t = self.thresholds
        median, count = _row_medians(ref)
        enough = (count >= t.min_history) & (step >= t.window)
        record = value > run_max
        if not enough.any() and t.explode_abs is None:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(enough & (median > 0), value / median, np.nan)
        finite = np.isfinite(value)
        held = finite & record & (np.nan_to_num(ratio, nan=0.0) > t.explode_factor)
        judged = finite & enough
        if t.explode_abs is not None:
            held |= finite & (value > t.explode_abs)
            judged = finite
        return judged, held, ratio

    def _vanishing(self, view: _View) -> _Outcome:
        rule = "vanishing_gradients"
        t = self.thresholds
        grads, params = view.grads, view.inp.param_norms
        if (
            grads is None
            or params is None
            or params.shape != (grads.shape[0],)
            or not view.has_new_layers
            or grads.shape[1] < t.vanish_steps
        ):
            return _nothing(rule)
        recent = grads[:, -t.vanish_steps :]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = recent / params[:, None]
        judged_mask = np.isfinite(recent).all(axis=1) & np.isfinite(params) & (params > 0)
        held_mask = judged_mask & (ratio < t.vanish_ratio).all(axis=1)
        held = [view.layer_names[i] for i in np.flatnonzero(held_mask)]
        step = float(view.layer_step_col[-1])
        worst = np.where(held_mask, ratio.max(axis=1, initial=-np.inf), np.nan)

        def make(new: list[str]) -> list[Alert]:
            index = view.layer_index()
            peak = max(float(worst[index[name]]) for name in new)
            return [
                Alert(
                    rule,
                    "warning",
                    f"Gradients vanishing in {name_list(new)} (grad norm / param norm below "
                    f"{_g(t.vanish_ratio)} for {t.vanish_steps} steps, at most {_g(peak)}) at "
                    f"step {int(step)}. These layers barely learn: use ReLU-family activations "
                    "instead of deep sigmoid/tanh stacks, add normalisation or residual "
                    "connections, or check the initialisation.",
                    int(step),
                    view.time_at(step),
                    tuple(new),
                )
            ]

        return _Outcome(rule, held, view.layer_judged(judged_mask), make)

    def _update_ratios(self, view: _View) -> list[_Outcome]:
        t = self.thresholds
        nothing = [_nothing("update_ratio_high"), _nothing("update_ratio_low")]
        ratios = view.inp.update_ratios
        n = len(view.layer_names)
        if ratios is None or ratios.shape != (n,):
            return nothing
        ratios = np.asarray(ratios, dtype=np.float64)
        if self._ratio_names != view.layer_names:
            self._ratio_names = view.layer_names
            self._ratio_prev = None
            self._high_streak = np.zeros(n, dtype=np.intp)
            self._low_streak = np.zeros(n, dtype=np.intp)
        # Ratios come every few steps; only a changed array is a new observation, and a streak
        # counts observations, so one noisy update does not raise an alert.
        fresh = self._ratio_prev is None or not np.array_equal(
            ratios, self._ratio_prev, equal_nan=True
        )
        if not fresh or view.inp.step < t.min_history:
            return nothing
        self._ratio_prev = ratios.copy()
        finite = np.isfinite(ratios)
        # Biases are often initialised to zero and stay near it, so ||w|| ~ 0 makes the ratio
        # large while nothing is wrong; the hint is about weights.
        weights = np.array([not name.endswith("bias") for name in view.layer_names], dtype=bool)
        high_judged = finite & weights
        # An update of exactly 0 is no gradient, a frozen parameter or lr == 0: the static
        # checks (debug.check_setup, gradient_not_flowing) name those, so skip them here.
        low_judged = finite & (ratios > 0)
        if view.grads is not None and view.grads.shape[1]:
            latest = view.grads[:, -1]
            low_judged &= np.isfinite(latest) & (latest > 0)
        self._high_streak = np.where(
            high_judged & (ratios > t.update_ratio_high), self._high_streak + 1, 0
        )
        self._low_streak = np.where(
            low_judged & (ratios < t.update_ratio_low), self._low_streak + 1, 0
        )
        high = self._high_streak >= t.sustain_steps
        low = self._low_streak >= t.sustain_steps
        step = view.inp.step

        def maker(
            rule: str, text: Callable[[list[str], float], str]
        ) -> Callable[[list[str]], list[Alert]]:
            def make(new: list[str]) -> list[Alert]:
                index = view.layer_index()
                values = [float(ratios[index[name]]) for name in new]
                extreme = max(values) if rule == "update_ratio_high" else min(values)
                return [Alert(rule, "warning", text(new, extreme), step, view.inp.time, tuple(new))]

            return make

        high_make = maker(
            "update_ratio_high",
            lambda new, v: (
                f"Updates are large for {name_list(new)} (||Δw||/||w|| up to {_g(v)}; healthy "
                f"is about 1e-3) at step {step}: learning rate too high?"
            ),
        )
        low_make = maker(
            "update_ratio_low",
            lambda new, v: (
                f"Updates are tiny for {name_list(new)} (||Δw||/||w|| down to {_g(v)}; healthy "
                f"is about 1e-3) at step {step}: learning rate too low, or parameters not "
                "really training?"
            ),
        )
        names = view.layer_names
        return [
            _Outcome(
                "update_ratio_high",
                [names[i] for i in np.flatnonzero(high)],
                view.layer_judged(high_judged),
                high_make,
            ),
            _Outcome(
                "update_ratio_low",
                [names[i] for i in np.flatnonzero(low)],
                view.layer_judged(low_judged),
                low_make,
            ),
        ]

    # -- loss shape -------------------------------------------------------------------------

    def _loss_spike(self, view: _View) -> _Outcome:
        rule = "loss_spike"
        t = self.thresholds
        loss = view.column("loss")
        if loss is None or not view.has_new_rows:
            return _nothing(rule)
        # Work on the logged values only, so a loss logged every k steps is judged the same.
        rows = np.flatnonzero(np.isfinite(loss[view.ref_from :])) + view.ref_from
        values = loss[rows]
        first_new = int(np.searchsorted(rows, view.new_from))
        ref = values[max(0, first_new - t.window) : first_new]
        if ref.size < t.min_history or first_new >= values.size:
            return _nothing(rule)
        median = float(_row_medians(ref[None, :])[0][0])
        mad = float(_row_medians(np.abs(ref - median)[None, :])[0][0])
        level, where = _sustained(values[None, :], first_new, t.sustain_steps)
        if not np.isfinite(level[0]):
            return _nothing(rule)
        # Relative to |median| so that negative losses (log-likelihoods) work too, and beyond
        # a robust noise band.
        excess = float(level[0]) - median
        old = values[:first_new]
        self._loss_lo = min(self._loss_lo, float(old.min()))
        self._loss_hi = max(self._loss_hi, float(old.max()))
        # A jump from 1e-4 to 1e-3 near convergence is noise, not a spike: it must also be a
        # real share of how far the loss has travelled in this run.
        span = self._loss_hi - self._loss_lo
        if not (
            excess > (t.spike_factor - 1) * abs(median)
            and excess > SPIKE_SIGMAS * MAD_TO_SIGMA * mad
            and excess > t.spike_range_fraction * span
        ):
            return _Outcome(rule, (), _always, lambda _new: [])
        row = int(rows[int(where[0])])
        step = float(view.step_col[row])
        value = float(level[0])

        def make(_new: list[str]) -> list[Alert]:
            how = f"{value / median:.0f}x the recent median" if median > 0 else "recent median"
            return [
                Alert(
                    rule,
                    "warning",
                    f"Loss spiked to {_g(value)} or more for {t.sustain_steps} steps from step "
                    f"{int(step)} ({how} {_g(median)}). The learning rate may be at the edge of "
                    "stability (lower it, add warmup or clip gradients), or a run of bad "
                    "batches: check the data around that step.",
                    int(step),
                    view.time_at(step),
                )
            ]

        return _Outcome(rule, ("",), _always, make)

    def _note_start_loss(self, view: _View) -> None:
        """Keep the first few logged losses: the level the plateau rule measures progress from."""
        if len(self._start_losses) >= START_LOSSES:
            return
        loss = view.column("loss")
        if loss is None:
            return
        after = -math.inf if self._last_step is None else self._last_step
        fresh = loss[(view.step_col > after) & np.isfinite(loss)]
        self._start_losses.extend(float(v) for v in fresh[: START_LOSSES - len(self._start_losses)])

    def _loss_plateau(self, view: _View) -> _Outcome:
        rule = "loss_plateau"
        t = self.thresholds
        loss = view.column("loss")
        window = t.plateau_window
        if (
            loss is None
            or not view.has_new_rows
            or loss.size < window
            or len(self._start_losses) < START_LOSSES
        ):
            return _nothing(rule)
        recent = _finite_or_nan(loss[-window:])
        quarter = window // 4
        first, last = recent[:quarter], recent[-quarter:]
        need = max(3, quarter // 4)  # sparse logging still gives a fair mean
        first_ok, last_ok = np.isfinite(first), np.isfinite(last)
        if first_ok.sum() < need or last_ok.sum() < need:
            return _nothing(rule)
        before = float(first[first_ok].mean())
        after = float(last[last_ok].mean())
        # statistics, not numpy: np.median imports numpy.ma on first use (~20 ms holding the
        # GIL on this thread, so the training thread too).
        start = statistics.median(self._start_losses)
        progress = (start - after) / abs(start) if start else math.inf
        # A loss that flattens after falling a long way has converged (or needs an LR decay);
        # the actionable case is a loss stuck near where it started.
        stuck = after >= before - t.plateau_tolerance * abs(before)
        if not (stuck and progress < t.plateau_progress):
            return _Outcome(rule, (), _always, lambda _new: [])
        step = float(view.step_col[-1])

        def make(_new: list[str]) -> list[Alert]:
            return [
                Alert(
                    rule,
                    "warning",
                    f"Loss has not decreased over the last {window} steps (mean {_g(before)} "
                    f"-> {_g(after)}; it started near {_g(start)}) at step {int(step)}. Try "
                    "another learning rate, check that labels match inputs and that the "
                    "optimizer holds the model's parameters.",
                    int(step),
                    view.time_at(step),
                )
            ]

        return _Outcome(rule, ("",), _always, make)

    # -- activations and devices ----------------------------------------------------------

    def _dead_units(self, view: _View) -> _Outcome:
        rule = "dead_units"
        t = self.thresholds
        stats = view.inp.activations
        # Zero-initialised branches (LoRA B, zero-gamma norms) output exact zeros for the
        # first steps by design: judge only after min_history steps.
        if not stats or view.inp.step < t.min_history:
            return _nothing(rule)
        fractions = {name: float(s.get("zero_frac", math.nan)) for name, s in stats.items()}
        judged_names = {name for name, f in fractions.items() if math.isfinite(f)}
        held = [
            name
            for name in fractions
            if name in judged_names and fractions[name] >= t.dead_fraction
        ]
        step = view.inp.step

        def make(new: list[str]) -> list[Alert]:
            low = min(fractions[name] for name in new)
            return [
                Alert(
                    rule,
                    "warning",
                    f"Dead units: at least {low:.0%} of the outputs of {name_list(new)} are "
                    f"exactly zero at step {step} (dead ReLUs?). Lower the learning rate, use "
                    "LeakyReLU/GELU, or check the initialisation and input scaling.",
                    step,
                    view.inp.time,
                    tuple(new),
                )
            ]

        return _Outcome(rule, held, judged_names.__contains__, make)

    def _device(self, view: _View) -> list[_Outcome]:
        t = self.thresholds
        system = view.inp.system
        if not system or not any(len(v) for v in system.values()):
            return []
        alerts = [
            *device_health.temperature_rule(system, t.temperature_c),
            *device_health.memory_rule(system, t.memory_fraction),
            *device_health.throttle_rule(system),
            *device_health.idle_rule(
                system, threshold_percent=t.idle_util_percent, gpus=view.inp.gpus
            ),
        ]
        rules = ("gpu_temperature", "device_memory", "gpu_throttling", "gpu_idle")
        by_rule: dict[str, dict[str, Alert]] = {rule: {} for rule in rules}
        for alert in alerts:
            match = _DEVICE_SUBJECT.match(alert.message)
            subject = match.group(1) if match else alert.message
            by_rule.setdefault(alert.rule, {}).setdefault(subject, alert)

        def maker(found: dict[str, Alert]) -> Callable[[list[str]], list[Alert]]:
            return lambda new: [found[s] for s in new]

        # A device rule looks at every device each time, so every subject is judged.
        return [
            _Outcome(rule, list(found), _always, maker(found)) for rule, found in by_rule.items()
        ]


__all__ = ["Health", "HealthInput", "Thresholds"]
