"""Rules on gradient norms: exploding (per layer and total), a one-step spike and the layer it
came from, vanishing, and the wording of the non-finite gradient report the engine detects
exactly per step.

Subjects: ``"layers"`` when an alert lists layers, ``"grad_norm"`` for the total norm alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import SYMPTOM, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, never, no_alerts, nothing
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView
from nbmonitor.health.window import (
    BoolArray,
    FloatArray,
    IntArray,
    abrupt,
    finite_or_nan,
    row_medians,
    sustained,
)
from nbmonitor.health.wording import SATURATING, kinds_of, layer_list, name_list, num

TOTAL = "<total>"  # held subject of the total grad norm in exploding_gradients (not a layer)
# An explosion is abrupt: it also beats the median of the NEAR_STEPS steps just before it
# by explode_factor. A warm-up, or a model leaving its initialisation, lifts the norms over
# tens of steps, and the steps just before are already high.
NEAR_STEPS = 10


def _true() -> bool:
    return True


def _false() -> bool:
    return False


class ExplodingGradients(Base):
    """A layer's (or the total) gradient norm held above ``explode_factor`` x its running
    median for ``sustain_steps`` steps, beating everything it has seen, above the run's
    starting scale, ``explode_factor`` x the median of its last ``NEAR_STEPS`` steps (it is
    abrupt) and, for a layer, above the total norm's recent median (or above
    ``explode_abs``)."""

    name = "exploding_gradients"
    doc = RuleDoc(
        SYMPTOM,
        "gradient norms grow far beyond their scale (also inside a loop that clips: the pre-clip "
        "norm)",
        "a layer's (or the total) gradient norm above 10x its running median for 3 steps, beyond "
        "anything it reached before and above the run's starting scale",
        "lower the learning rate or clip gradients",
        (
            "a norm that decayed while the model converged and then jumps",
            "warm-up",
            "long healthy runs",
        ),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        # Run-wide maxima: an explosion is a new maximum.
        self._total_max = -math.inf
        self._layer_max: FloatArray | None = None
        # The last step each maximum includes.
        self._total_max_step = -math.inf
        self._layer_max_step = -math.inf
        # The run's starting scale (median of its first min_history values): an explosion
        # also rises above where the run began, so a norm that decayed 1000x while the model
        # converged and then jitters 10x is not one.
        self._total_start = math.nan
        self._layer_start: FloatArray | None = None

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        held: list[str] = []
        judged_total: Callable[[], bool] = _false
        # subject -> (value, factor over the median or NaN, step)
        detail: dict[str, tuple[float, float, float]] = {}

        total = view.column("grad_norm")

        def total_ref() -> tuple[FloatArray, IntArray]:
            # The total norm's median over the reference window, and how many values it has
            # (the total's verdict and the layers' floor both read it): made only when asked.
            assert total is not None
            return view.shared(
                ("reference median", "grad_norm"),
                lambda: row_medians(total[None, view.ref_from : view.new_from]),
            )

        if total is not None and view.has_new_rows:
            # The run's maximum before the sustained window that is being judged.
            cut = max(0, view.new_from - t.sustain_steps + 1)
            fresh = int(np.searchsorted(view.step_col[:cut], self._total_max_step, "right"))
            seen = total[fresh:cut]
            seen = seen[np.isfinite(seen)]
            if seen.size:
                self._total_max = max(self._total_max, float(seen.max()))
            if fresh < cut:
                self._total_max_step = float(view.step_col[cut - 1])
            if not math.isfinite(self._total_start):
                self._total_start = float(self._start_level(total[None, :])[0])
            start = np.array([self._total_start])
            run_max = np.array([self._total_max])
            bar = np.fmax(run_max, start)
            rows = total[None, :]
            rises = self._rises(rows, view.new_from, bar)
            if rises or t.explode_abs is not None:
                median, count = total_ref()
                value, where, seen_rows = self._levels(
                    rows, view.new_from, median if rises else None, bar
                )
                verdict = self._explodes(median, count, value, run_max, start, seen_rows)
                if verdict is not None:
                    is_judged, is_held, ratio = verdict
                    judged_total = _true if is_judged[0] else _false
                    if is_held[0]:
                        held.append(TOTAL)
                        step = view.step_col[int(where[0])]
                        detail[TOTAL] = (float(value[0]), float(ratio[0]), float(step))
            else:
                # Nothing rises above the run's maximum: the total cannot hold. Whether it was
                # judged (clear) is worked out only if asked (an episode of it is open).
                def judged_total() -> bool:
                    median, count = total_ref()
                    value, _, seen_rows = self._levels(rows, view.new_from, None, bar)
                    verdict = self._explodes(median, count, value, run_max, start, seen_rows)
                    return verdict is not None and bool(verdict[0][0])

        layer_judged: Callable[[str], bool] = never
        grads = view.grads
        if grads is not None and view.has_new_layers:
            reference = grads[:, view.layer_ref_from : view.layer_new_from]
            if self._layer_max is None or self._layer_max.shape[0] != grads.shape[0]:
                self._layer_max = np.full(grads.shape[0], -np.inf)
                self._layer_max_step = -math.inf
                self._layer_start = np.full(grads.shape[0], np.nan)
            assert self._layer_start is not None
            unknown = np.flatnonzero(np.isnan(self._layer_start))
            if unknown.size:
                self._layer_start[unknown] = self._start_level(grads[unknown])
            # The run's maximum grows by the columns not yet in it (one pass per column in all,
            # not one per check over the whole window).
            cut = max(0, view.layer_new_from - t.sustain_steps + 1)
            fresh = int(np.searchsorted(view.layer_step_col[:cut], self._layer_max_step, "right"))
            if fresh < cut:
                # Each row's largest finite value (NaN where none): what row_max gives.
                seen_max = np.fmax.reduce(finite_or_nan(grads[:, fresh:cut]), axis=1)
                self._layer_max = np.fmax(self._layer_max, seen_max)
                self._layer_max_step = float(view.layer_step_col[cut - 1])
            layer_max = self._layer_max
            layer_start = self._layer_start

            def floor_of() -> FloatArray:
                # A layer's explosion also stands out in the whole model's gradient: it rises
                # above the total norm's recent median (a LayerNorm gain whose small gradient
                # grows while the model learns is not one).
                if total is None:
                    return layer_start
                floor: FloatArray = np.fmax(layer_start, total_ref()[0][0])
                return floor

            # The floor only raises the bar: where no window rises above the bar without it,
            # none does with it, and its median is not needed.
            rises = self._rises(grads, view.layer_new_from, np.fmax(layer_max, layer_start))
            if rises or t.explode_abs is not None:
                floor = floor_of()
                bar = np.fmax(layer_max, floor)
                if rises and self._rises(grads, view.layer_new_from, bar):
                    median, count = row_medians(reference)
                    value, where, seen_rows = self._levels(grads, view.layer_new_from, median, bar)
                else:
                    # No window rises above the run's maximum: none is an explosion, whatever
                    # the medians (a sort of every layer's reference window) would say.
                    median = np.full(grads.shape[0], np.nan)
                    count = np.isfinite(reference).sum(axis=1)
                    value, where, seen_rows = self._levels(grads, view.layer_new_from, None, bar)
                verdict = self._explodes(median, count, value, layer_max, floor, seen_rows)
                if verdict is not None:
                    is_judged, is_held, ratio = verdict
                    layer_judged = view.layer_judged(is_judged)
                    steps = view.layer_step_col[where]
                    for i in np.flatnonzero(is_held):
                        name = view.layer_names[i]
                        held.append(name)
                        detail[name] = (float(value[i]), float(ratio[i]), float(steps[i]))
            else:
                # No layer can hold. Which were judged (clear) is worked out only if asked.
                judged_layers: list[Callable[[str], bool]] = []

                def layer_judged(subject: str) -> bool:
                    if not judged_layers:
                        floor = floor_of()
                        count = np.isfinite(reference).sum(axis=1)
                        value, _, seen_rows = self._levels(
                            grads, view.layer_new_from, None, np.fmax(layer_max, floor)
                        )
                        median = np.full(grads.shape[0], np.nan)
                        verdict = self._explodes(median, count, value, layer_max, floor, seen_rows)
                        judged_layers.append(
                            never if verdict is None else view.layer_judged(verdict[0])
                        )
                    return judged_layers[0](subject)

        def judged(subject: str) -> bool:
            return judged_total() if subject == TOTAL else layer_judged(subject)

        def make(new: list[str]) -> list[Alert]:
            layers = [s for s in new if s != TOTAL]
            worst = max(new, key=lambda s: (detail[s][1], detail[s][0]))
            value, ratio, step = detail[worst]
            how = (
                f"{num(ratio)}x its recent median"
                if math.isfinite(ratio) and ratio > t.explode_factor
                else f"above the limit {num(t.explode_abs or math.nan)}"
            )
            what = (
                f"Gradients exploding in {layer_list(layers, view.inp.module_kinds)} "
                f"(grad norm {num(value)}, {how})"
                if layers
                else f"Total gradient norm exploding ({num(value)}, {how})"
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
                    subject=subjects.LAYERS if layers else subjects.GRAD_NORM,
                )
            ]

        return Outcome(rule, held, judged, make, spreads=True)

    def _rises(self, rows: FloatArray, start: int, floor: FloatArray) -> bool:
        """Whether a window ``_levels`` judges is held above ``floor`` in some row (NaN: no
        floor): without one, no abrupt level can be found, whatever the medians."""
        m = self.thresholds.sustain_steps
        lo = max(start - (m - 1), NEAR_STEPS)  # the windows ``abrupt`` judges
        if rows.shape[1] - lo < m:
            return False
        seg = rows[:, lo:]
        with np.errstate(invalid="ignore"):
            above = seg > np.where(np.isnan(floor), -np.inf, floor)[:, None]
        # A window held above the floor needs each of its values above it: where no value
        # is, no window is (the common case, without the windows' minima).
        if not above.any():
            return False
        width = above.shape[1] - m + 1
        held = above[:, :width].copy()
        for k in range(1, m):
            held &= above[:, k : k + width]
        return bool(held.any())

    def _levels(
        self, rows: FloatArray, start: int, median: FloatArray | None, floor: FloatArray
    ) -> tuple[FloatArray, IntArray, BoolArray]:
        """Per row, the largest abrupt sustained level from column ``start`` on that could be
        an explosion (above ``explode_factor`` x ``median``, the reference window's, and above
        ``floor``)
        and where its window begins (with ``explode_abs``, any sustained level above it too),
        and whether the row had a sustained level at all (judged, held or clear). ``median``
        None: no window rises above ``floor`` (``_rises``), so none is abrupt."""
        t = self.thresholds
        plain, at = sustained(rows, start, t.sustain_steps)
        if median is None:
            value, where = np.full(rows.shape[0], np.nan), np.zeros(rows.shape[0], dtype=np.intp)
        else:
            bar = np.fmax(t.explode_factor * median, floor)
            value, where = abrupt(rows, start, t.sustain_steps, NEAR_STEPS, t.explode_factor, bar)
        if t.explode_abs is not None:
            over = plain > t.explode_abs
            value, where = np.where(over, plain, value), np.where(over, at, where)
        seen: BoolArray = np.isfinite(plain)
        return value, where, seen

    def _start_level(self, rows: FloatArray) -> FloatArray:
        """Per row, the median of its first ``min_history`` finite values; NaN until it has
        that many."""
        need = self.thresholds.min_history
        clean = finite_or_nan(rows)
        ok = np.isfinite(clean)
        # The first `need` finite values of each row, the rest NaN.
        first = np.where(ok & (np.cumsum(ok, axis=1) <= need), clean, np.nan)
        median, count = row_medians(first)
        return np.where(count >= need, median, np.nan)

    def _explodes(
        self,
        median: FloatArray,
        count: IntArray,
        value: FloatArray,
        run_max: FloatArray,
        start: FloatArray,
        seen: BoolArray,
    ) -> tuple[BoolArray, BoolArray, FloatArray] | None:
        """Which rows were judged, which rows' newest maximum is an explosion, and by what
        factor of their running median.

        Relative to the median alone, gradients that rise during learning-rate warm-up, or
        fluctuate around a converged minimum, read as explosions; a real explosion also
        beats everything the row has seen and rises above the run's starting scale
        (``start``), so it is large in absolute terms too, not only against a small recent
        median.
        """
        t = self.thresholds
        enough = (count >= t.min_history) & np.isfinite(start)
        record = value > run_max
        if not enough.any() and t.explode_abs is None:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(enough & (median > 0), value / median, np.nan)
            # The starting scale is a median of finite values: finite or NaN (not known yet).
            large = value > np.where(np.isnan(start), np.inf, start)
        finite = np.isfinite(value)
        held = finite & record & large & (ratio > t.explode_factor)  # NaN: not a factor
        judged = seen & enough
        if t.explode_abs is not None:
            held |= finite & (value > t.explode_abs)
            judged = seen
        return judged, held, ratio


# A layer is where a spike came from when its rise is within this factor of the largest rise.
# The gradient reaching the layers before the origin is multiplied alike (backward is linear),
# so the origin is the last of those, in the model's parameter order.
ORIGIN_SHARE = 4.0


# A spike is judged against the run's own tail as well: the log rise of each step over the
# least norm of the window before it is kept for the last TAIL_STEPS steps, and a spike's rise
# must lie where that tail would put one step in RETURN_STEPS, extrapolated from its top
# TAIL_SHARE by the Hill estimate of its shape (the mean excess of the top log rises). A
# converged classifier's small batches make 100x-1000x steps now and then (a hard sample among
# easy ones): there the tail is heavy and such steps are its noise. Where the norms are steady
# the tail is thin, the extrapolation stays close to it, and grad_spike_factor is the bar.
TAIL_STEPS = 1024
TAIL_SHARE = 0.02
# The fewest top values the shape is estimated from (the Hill estimate is unstable on fewer):
# early in a run, when the tail holds only a hundred steps, it is a larger share of them.
TAIL_MIN_K = 10
RETURN_STEPS = 100_000


def _trailing_minima(seg: FloatArray, window: int) -> FloatArray:
    """``sliding_window_view(seg, window).min(axis=1)`` (no NaN in ``seg``) in a few calls
    whatever the number of windows: with fewer windows than ``window``, each is the minimum of
    the part every window shares, the end of the part before it and the start of the part
    after it."""
    k = seg.size - window + 1
    if k > window:
        # More windows than a window is long (a wide slice): blocks of ``window`` values, the
        # minimum of each block's tail and of the next one's head (van Herk / Gil-Werman).
        pad = -seg.size % window
        blocks = (np.concatenate((seg, np.full(pad, np.inf))) if pad else seg).reshape(-1, window)
        head = np.minimum.accumulate(blocks, axis=1).ravel()
        tail = np.minimum.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()
        wide: FloatArray = np.minimum(tail[:k], head[window - 1 : window - 1 + k])
        return wide
    least = np.full(k, seg[k - 1 : window].min())
    if k > 1:
        # Window j holds seg[j:k-1] before the shared part and seg[window:window+j] after it.
        np.minimum(least[:-1], np.minimum.accumulate(seg[k - 2 :: -1])[::-1], out=least[:-1])
        np.minimum(least[1:], np.minimum.accumulate(seg[window : window + k - 1]), out=least[1:])
    return least


class GradientSpike(Base):
    """One step whose total gradient norm is ``grad_spike_factor`` x the median of the steps
    before it (``window`` of them, at least ``min_history``) and above the run's starting
    scale; it holds at that step, for the layer it came from: of the layers whose norm rose
    most against their own recent median (within ``ORIGIN_SHARE``), the last in parameter
    order, since a spike injected at a layer multiplies every gradient behind it alike.
    Clipping does not hide it: ``grad_norm`` is the norm before clipping."""

    name = "gradient_spike"
    doc = RuleDoc(
        SYMPTOM,
        "one step's gradient spikes, named at the layer it came from",
        "one step's total gradient norm (before clipping) above 20x the median of the 100 steps "
        "before it and above the run's starting scale; the layer whose norm rose most against its "
        "own median",
        "find the batch or the layer that produced it; clip gradients if it recurs",
        ("heavy-tailed per-step norms of small batches", "long healthy runs"),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._start = math.nan  # the median of the run's first min_history norms
        # The log rises of the last TAIL_STEPS steps (a ring; NaN where not yet filled).
        self._tail = np.full(TAIL_STEPS, np.nan)
        self._tail_at = 0

    def _tail_bar(self) -> float:
        """The log rise a spike must beat to stand out of the run's own tail (-inf while the
        tail holds fewer than min_history steps)."""
        seen = self._tail[np.isfinite(self._tail)]
        n = seen.size
        if n < self.thresholds.min_history:
            return -math.inf
        k = min(n - 1, max(TAIL_MIN_K, int(TAIL_SHARE * n)))
        part = np.partition(seen, n - k - 1)
        edge = float(part[n - k - 1])
        shape = float(np.mean(part[n - k :] - edge))
        return edge + shape * math.log(k * RETURN_STEPS / n)

    def _note_tail(self, rises: FloatArray) -> None:
        rises = rises[np.isfinite(rises)][-TAIL_STEPS:]
        n = rises.size
        if not n:
            return
        at = (self._tail_at + np.arange(n)) % TAIL_STEPS
        self._tail[at] = rises
        self._tail_at = int((self._tail_at + n) % TAIL_STEPS)

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        total = view.column("grad_norm")
        if total is None or not view.has_new_rows:
            return nothing(rule)
        if not math.isfinite(self._start):
            clean = total[np.isfinite(total)]
            if clean.size >= t.min_history:
                self._start = float(row_medians(clean[None, : t.min_history])[0][0])
        if not math.isfinite(self._start):
            return nothing(rule)
        # Row k: the `window` norms before new row new_from + k (NaN-padded at the start).
        lo = view.new_from - t.window
        seg = total[lo:-1] if lo >= 0 else np.concatenate((np.full(-lo, np.nan), total[:-1]))
        finite = np.isfinite(seg)
        value = total[view.new_from :]
        if finite.all():  # every window full (the usual case)
            judged = np.isfinite(value) & (t.window >= t.min_history)
            least = _trailing_minima(seg, t.window)
        else:
            seen = np.concatenate(([0], np.cumsum(finite)))
            count = seen[t.window :] - seen[: -t.window]  # finite norms in each row's window
            judged = (count >= t.min_history) & np.isfinite(value)
            least = _trailing_minima(np.where(finite, seg, np.inf), t.window)
        if not judged.any():
            return nothing(rule)
        # A spike beats grad_spike_factor x the median of the finite norms before it, so that
        # factor x their least too: the medians (a sort per row) are taken for those rows only.
        with np.errstate(divide="ignore", invalid="ignore"):
            rise = np.where(judged & (least > 0), np.log(value / least), np.nan)
            candidate = judged & (value > t.grad_spike_factor * least) & (value > self._start)
        if not candidate.any():
            # No step beats the factor: none is a spike, whatever the run's tail would say.
            self._note_tail(rise)
            return clear(rule)
        bar = self._tail_bar()
        self._note_tail(rise)
        with np.errstate(invalid="ignore"):
            rows = np.flatnonzero(candidate & (rise > bar))
        factor = np.full(value.size, np.nan)
        if rows.size:
            median, _ = row_medians(sliding_window_view(seg, t.window)[rows])
            with np.errstate(divide="ignore", invalid="ignore"):
                factor[rows] = np.where(median > 0, value[rows] / median, np.nan)
        spike = (factor > t.grad_spike_factor) & (value > self._start)  # NaN: not a factor
        if not spike.any():
            return clear(rule)
        k = int(np.nanargmax(np.where(spike, factor, np.nan)))
        peak, times = float(value[k]), float(factor[k])
        step = float(view.step_col[view.new_from + k])
        layers, everywhere = self._origin(view, step)
        subject = ",".join(layers) if layers else TOTAL

        def make(new: list[str]) -> list[Alert]:
            if layers:
                where = (
                    f"It came from {layer_list(layers, view.inp.module_kinds)}, whose gradient "
                    "rose most against its own recent median (layers before it only pass it on)."
                )
            elif everywhere:
                where = (
                    "Every layer's gradient rose alike: it came from the loss (an outlier batch, "
                    "a bad label or a loss spike), not from one layer."
                )
            else:
                where = "The per-layer norms of that step are not known."
            return [
                Alert(
                    rule,
                    "warning",
                    f"Gradient spike at step {int(step)}: grad norm {num(peak)}, "
                    f"{num(times)}x its recent median. {where} Check that step's batch; "
                    "clip gradients (torch.nn.utils.clip_grad_norm_) or lower the learning rate "
                    "if it recurs.",
                    int(step),
                    view.time_at(step),
                    tuple(layers),
                    subject=subjects.LAYERS if layers else subjects.GRAD_NORM,
                )
            ]

        return Outcome(rule, [subject], always, make)

    def _origin(self, view: HealthView, step: float) -> tuple[list[str], bool]:
        """The parameters of the layer the spike at ``step`` came from, and whether every
        layer rose alike instead."""
        grads = view.grads
        if grads is None:
            return [], False
        cols = view.layer_step_col
        j = int(np.searchsorted(cols, step))
        if j >= cols.size or cols[j] != step:
            return [], False
        t = self.thresholds
        median, count = row_medians(grads[:, max(0, j - t.window) : j])
        with np.errstate(divide="ignore", invalid="ignore"):
            rise = np.where((count >= t.min_history) & (median > 0), grads[:, j] / median, np.nan)
        if not np.isfinite(rise).any():
            return [], False
        top = float(np.nanmax(rise))
        near = np.isfinite(rise) & (rise >= top / ORIGIN_SHARE)
        measured = np.isfinite(rise)
        if near[measured].all() and measured.sum() > 1:
            return [], True
        last = int(np.flatnonzero(near)[-1])
        names = view.layer_names
        module = names[last].rpartition(".")[0]
        # The origin's other parameters that rose with it (a weight and its bias).
        same = [
            names[i]
            for i in np.flatnonzero(near)
            if names[i].rpartition(".")[0] == module and module
        ]
        return same or [names[last]], False


class VanishingGradients(Base):
    """A layer's grad norm / param norm below ``vanish_ratio`` for ``vanish_steps`` steps.

    Gradients that are exactly zero are not vanishing but cut: with activation statistics
    showing dead units, those layers are left to ``dead_units``; without, the message says
    that nothing flows back rather than that little does."""

    name = "vanishing_gradients"
    doc = RuleDoc(
        SYMPTOM,
        "gradients too small to learn in some layers",
        "gradient norm / parameter norm below 1e-7 in some layers for 20 recorded steps",
        "replace saturating activations, add normalisation or residual connections, or fix the "
        "initialisation scale",
        (
            "a conv bias before BatchNorm (a zero gradient by construction)",
            "frozen layers",
            "adapters on a frozen base",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        grads, params = view.grads, view.inp.param_norms
        if (
            grads is None
            or params is None
            or params.shape != (grads.shape[0],)
            or not view.has_new_layers
            or grads.shape[1] < t.vanish_steps
        ):
            return nothing(rule)
        recent = grads[:, -t.vanish_steps :]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = recent / params[:, None]
        judged_mask = np.isfinite(recent).all(axis=1) & np.isfinite(params) & (params > 0)
        if _dead_modules(view, t.dead_fraction):
            # dead units explain them: dead_units names the modules
            judged_mask &= ~(recent == 0).all(axis=1)
        held_mask = judged_mask & (ratio < t.vanish_ratio).all(axis=1)
        if not held_mask.any():
            return Outcome(rule, (), view.layer_judged(judged_mask), no_alerts, spreads=True)
        held_mask &= ~cancelled_biases(view.layer_names, held_mask, judged_mask)
        held = [view.layer_names[i] for i in np.flatnonzero(held_mask)]
        step = float(view.layer_step_col[-1])
        kinds = view.inp.module_kinds

        def make(new: list[str]) -> list[Alert]:
            index = view.layer_index()
            zero = (recent == 0).all(axis=1)
            worst = np.where(held_mask, ratio.max(axis=1, initial=-np.inf), np.nan)
            peak = max(float(worst[index[name]]) for name in new)
            where = layer_list(new, kinds)
            if all(zero[index[name]] for name in new):
                message = (
                    f"Gradients are exactly zero in {where} for {t.vanish_steps} steps (from "
                    f"step {int(step) - t.vanish_steps + 1}): nothing flows back to them. The "
                    "units after them may be dead (all-zero ReLU outputs: attach(..., "
                    "activations=True) names them), or the path to the loss is cut."
                )
            else:
                shrink = _shrinks_backwards(view.layer_names, ratio, judged_mask, held_mask)
                if shrink is not None:
                    return [_vanishing_cause(view, new, kinds, peak, shrink, int(step), t)]
                message = (
                    f"Gradients vanishing in {where} (grad norm / param norm below "
                    f"{num(t.vanish_ratio)} for {t.vanish_steps} steps, at most {num(peak)}) at "
                    f"step {int(step)}. These layers barely learn: {_vanishing_advice(kinds)}"
                )
            return [
                Alert(
                    rule,
                    "warning",
                    message,
                    int(step),
                    view.time_at(step),
                    tuple(new),
                    subject=subjects.LAYERS,
                )
            ]

        return Outcome(rule, held, view.layer_judged(judged_mask), make, spreads=True)


def _shrinks_backwards(
    names: Sequence[str], ratio: FloatArray, judged: BoolArray, held: BoolArray
) -> tuple[float, float, int] | None:
    """When the vanishing weights are the first ones in parameter order and the weights'
    grad/param ratio rises from the input to the output (each layer on the way back shrinks
    the gradient), that profile: (the first weight's ratio, the last's, weights between);
    else None."""
    weights = [i for i, n in enumerate(names) if not n.endswith("bias") and judged[i]]
    if len(weights) < 3:
        return None
    level = _medians(ratio[weights])
    vanishing = [bool(held[i]) for i in weights]
    # A prefix: the input side vanished, the output side learns.
    k = vanishing.index(False) if False in vanishing else len(vanishing)
    if k == 0 or any(vanishing[k:]):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        rising = np.diff(np.log(level))
    if not (np.isfinite(rising).all() and (rising > 0).sum() >= 0.75 * rising.size):
        return None
    return float(level[0]), float(level[-1]), len(weights)


def _medians(a: FloatArray) -> FloatArray:
    """``np.median(a, axis=1)``, bit for bit, without its first call importing ``numpy.ma``
    (tens of milliseconds holding the GIL on the sampler thread, so the training thread's)."""
    cols = a.shape[1]
    ordered = np.sort(a, axis=1)
    if cols % 2:
        median = ordered[:, cols // 2]
    else:  # np.median's mean of the two middle values: their sum, halved
        with np.errstate(over="ignore"):
            median = np.add(ordered[:, cols // 2 - 1], ordered[:, cols // 2]) / 2
    out: FloatArray = np.where(np.isnan(a).any(axis=1), np.nan, median)
    return out


def _vanishing_cause(
    view: HealthView,
    new: list[str],
    kinds: Mapping[str, str] | None,
    peak: float,
    shrink: tuple[float, float, int],
    step: int,
    t: Thresholds,
) -> Alert:
    first, last, count = shrink
    per_layer = (last / first) ** (1 / max(1, count - 1))
    saturating = sorted(kinds_of(list(kinds or {}), kinds) & SATURATING)
    if saturating:
        cause = (
            f"The deep stack of {'/'.join(saturating)} layers saturates: each layer shrinks "
            "the gradient on its way back, so the first layers barely learn"
        )
        fix = (
            f"replace {'/'.join(saturating)} with ReLU/GELU, or add residual connections or "
            "normalisation (LayerNorm/BatchNorm) between the layers"
        )
    else:
        cause = (
            "Each layer shrinks the gradient on its way back (weights initialised too small "
            "for the depth): the first layers barely learn"
        )
        fix = (
            "initialise for the depth (torch.nn.init.kaiming_normal_ for ReLU, the default "
            "nn.Linear init otherwise), or add normalisation or residual connections"
        )
    return cause_alert(
        "vanishing_gradients",
        cause=cause,
        said=f"grad norm / param norm {num(last)} at the last weight layer, {num(first)} at the "
        f"first, about {num(per_layer)}x smaller each layer back; below {num(t.vanish_ratio)} "
        f"in {layer_list(new, kinds)} for {t.vanish_steps} steps by step {step}",
        evidence={
            "grad_to_param_first": first,
            "grad_to_param_last": last,
            "shrink_per_layer": per_layer,
            "weight_layers": count,
            "grad_to_param_max_vanishing": peak,
            "steps": t.vanish_steps,
            "saturating": saturating,
        },
        fix=fix,
        layers=new,
        step=step,
        time=view.time_at(step),
    )


def cancelled_biases(names: Sequence[str], vanishing: BoolArray, judged: BoolArray) -> BoolArray:
    """The biases whose gradient (or update) is nil while their module's weight learns: zero
    by construction, not vanishing. A conv/linear bias right before a BatchNorm (the norm
    subtracts the batch mean, so the gradient reaching the bias sums to zero in every channel)
    is the common case; a module whose gradients vanish loses all its parameters' at once."""
    if not vanishing.any():
        return np.zeros(len(names), dtype=bool)
    module, bias = _modules(tuple(names))
    learning = np.zeros(len(names) + 1, dtype=bool)  # by module number
    learning[module[judged & ~vanishing]] = True
    out: BoolArray = vanishing & bias & learning[module]
    return out


@functools.lru_cache(maxsize=8)
def _modules(names: tuple[str, ...]) -> tuple[IntArray, BoolArray]:
    """Each parameter's module as a number (the same for the parameters of one module), and
    whether it is the bias of a named module (read-only: shared between checks)."""
    numbers: dict[str, int] = {}
    module = np.empty(len(names), dtype=np.intp)
    bias = np.empty(len(names), dtype=bool)
    for i, name in enumerate(names):
        owner, _, leaf = name.rpartition(".")
        module[i] = numbers.setdefault(owner, len(numbers))
        bias[i] = leaf == "bias" and bool(owner)
    module.flags.writeable = False
    bias.flags.writeable = False
    return module, bias


def _dead_modules(view: HealthView, fraction: float) -> bool:
    stats = view.inp.activations or {}
    return any(s.get("zero_frac", 0.0) >= fraction for s in stats.values())


def _vanishing_advice(kinds: Mapping[str, str] | None) -> str:
    """What to try, fitted to the model: replacing sigmoid/tanh only where it has some."""
    saturating = sorted(kinds_of(list(kinds or {}), kinds) & SATURATING)
    tips = ["add normalisation (LayerNorm/BatchNorm) or residual connections"]
    if saturating:
        tips.insert(0, f"replace the deep {'/'.join(saturating)} stack with ReLU/GELU")
    tips.append("check the initialisation scale (too small a scale starves the first layers)")
    return ", ".join(tips[:-1]) + f", or {tips[-1]}."


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
            f" The first module with a non-finite output was {module} at step {f_step} "
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
    subject = subjects.LAYERS if bad else subjects.GRAD_NORM
    return Alert("grad_non_finite", "error", message, step, time, tuple(bad), subject=subject)


# non_finite_gradients' alert in the table of causes (it is worded here, found by the engine).
DOCS = {
    "grad_non_finite": RuleDoc(
        SYMPTOM,
        "gradients became NaN or Inf at a step",
        "the raw per-parameter gradient norms of every step, naming the first parameters (with "
        "`check_forward=True` the first module whose output was non-finite)",
        "lower the learning rate, clip gradients, or check the inputs",
    ),
}


__all__ = [
    "TOTAL",
    "ExplodingGradients",
    "GradientSpike",
    "VanishingGradients",
    "cancelled_biases",
    "non_finite_gradients",
]
