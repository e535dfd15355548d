"""Weight decay too strong: every weight layer's norm shrinks steadily, step after step, by
about as much as the whole update moves it, while the loss does not improve. Subject:
``"layers"``.

Decay pulls each weight towards zero by lr x weight_decay of itself per step; the gradient's
part of an update points anywhere. When the norm shrinks per step by most of the update ratio
``||Δw||/||w||``, nearly the whole update is that pull: the decay outweighs the gradient.
Healthy training changes the norm far less than the update moves the weights.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.rules.updates import weight_rows
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView
from nbmonitor.health.window import BoolArray, FloatArray
from nbmonitor.health.wording import num

# The norm's shrink per step is "most of the update" at this share of the update ratio.
PULL_SHARE = 0.5
# The weight layers in which it must hold: all but this share of them (a head or an
# embedding may be held up by its gradient).
ALL_BUT = 0.25


# The pull must hold over the measured steps of at least this share of ``window`` steps (and
# ``sustain_steps`` intervals), over which the loss has not improved (its recent median not
# below IMPROVED x its median when they began).
SPAN_SHARE = 0.5
# Weights whose median norm is below this share of its first measured value have collapsed.
COLLAPSED = 0.5
IMPROVED = 0.9
LOSSES = 10


def _loss_level(view: HealthView, step: float, before: bool) -> float:
    loss = view.column("loss")
    if loss is None:
        return math.nan
    end = int(np.searchsorted(view.step_col, step, side="right"))
    seg = loss[max(0, end - LOSSES) : end] if before else loss[-LOSSES:]
    seg = seg[np.isfinite(seg)]
    return statistics.median(seg.tolist()) if seg.size else math.nan


def _same(a: FloatArray, b: FloatArray) -> bool:
    """Whether two arrays hold the same values bit for bit (a NaN equal to itself, -0.0 not
    to 0.0: what differs only so is worked out again, to the same verdict)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype != np.float64:
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool((a.view(np.int64) == b.view(np.int64)).all())


@dataclasses.dataclass(frozen=True)
class _Pull:
    """What the update series says (``WeightDecayTooHigh._pulled``): whether the weights
    collapsed; the first interval judged, each weight layer's shrink per step and update ratio
    over the intervals and whether the pull holds in it (None: too little to judge); whether
    it holds in enough of them."""

    collapsed: bool
    lo: int = 0
    shrink: FloatArray | None = None
    r: FloatArray | None = None
    holds: BoolArray | None = None
    enough: bool = False


class WeightDecayTooHigh(Base):
    """Over the intervals between measured steps spanning ``SPAN_SHARE`` x ``window`` steps
    (at least ``sustain_steps`` of them), in all but ``ALL_BUT`` of the weight layers: the norm
    fell in every interval, by at least ``PULL_SHARE`` of the update ratio per step; and the
    loss has not improved over them. It keeps holding while the weights stay collapsed (the
    median weight layer below half of its first measured norm)."""

    name = "weight_decay_too_high"
    explains = ("vanishing_gradients", "loss_plateau", "update_ratio_high", "dead_units")
    doc = RuleDoc(
        CAUSE,
        "weight decay pulls every weight towards zero faster than the gradient pushes back: "
        "the parameter norms shrink steadily",
        "in (nearly) every weight layer the norm falls at each measured step by at least half "
        "of `‖Δw‖/‖w‖` per step, while the loss does not fall",
        "lower weight_decay (AdamW: 0.01 to 0.1 is usual; SGD: 1e-4 to 5e-4)",
        ("AdamW with weight_decay 0.01", "norms that shrink while the loss falls"),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._found: list[str] = []  # the layers named, while the episode lasts
        # The last series judged and what its intervals say (the series changes only on a
        # measured step, every layer_every steps once the run is past its first steps, while
        # the rules judge every grid point).
        self._last: tuple[tuple[FloatArray, FloatArray, FloatArray, BoolArray], _Pull] | None
        self._last = None

    def _pull(
        self, steps: FloatArray, ratios: FloatArray, norms: FloatArray, weights: BoolArray
    ) -> _Pull:
        """``_pulled``, again only when the series changed."""
        if self._last is not None:
            (s, r, n, w), pull = self._last
            if w is weights and _same(s, steps) and _same(r, ratios) and _same(n, norms):
                return pull
        pull = self._pulled(steps, ratios, norms, weights)
        self._last = (steps.copy(), ratios.copy(), norms.copy(), weights), pull
        return pull

    def _pulled(
        self, steps: FloatArray, ratios: FloatArray, norms: FloatArray, weights: BoolArray
    ) -> _Pull:
        """Whether the weights collapsed, and over which intervals and in which weight layers
        the decay's pull holds: a function of the update series alone."""
        t = self.thresholds
        collapsed = self._collapsed(norms, weights)
        # The newest intervals, back until they span enough steps; or, once the weights have
        # collapsed (a strong decay is over in tens of steps, then holds them near zero), the
        # intervals of the decline, from the first measured step to the collapse.
        gaps = np.diff(steps)
        span = np.cumsum(gaps[::-1])
        m = max(t.sustain_steps, int(np.searchsorted(span, SPAN_SHARE * t.window)) + 1)
        lo, hi = steps.size - 1 - m, steps.size - 1
        if collapsed:
            with np.errstate(divide="ignore", invalid="ignore"):
                left = np.nanmedian(norms[weights] / norms[weights][:, :1], axis=0)
            down = np.flatnonzero(left < COLLAPSED)
            lo, hi = 0, max(int(down[0]) if down.size else 0, t.sustain_steps)
        if lo < 0 or hi >= steps.size or hi - lo < t.sustain_steps:
            return _Pull(collapsed)
        p = norms[weights][:, lo : hi + 1]
        r = ratios[weights][:, lo + 1 : hi + 1]
        gap = gaps[lo:hi]
        with np.errstate(divide="ignore", invalid="ignore"):
            shrink = 1.0 - (p[:, 1:] / p[:, :-1]) ** (1.0 / gap)
            pulled = (shrink > 0) & (shrink >= PULL_SHARE * r)
        known = np.isfinite(p).all(axis=1) & (p > 0).all(axis=1) & np.isfinite(r).all(axis=1)
        if known.sum() < 2:
            return _Pull(collapsed)
        holds: BoolArray = np.logical_and(pulled.all(axis=1), known)
        enough = bool(holds.sum() >= math.ceil((1 - ALL_BUT) * known.sum()))
        return _Pull(collapsed, lo, shrink, r, holds, enough)

    def _collapsed(self, norms: FloatArray, weights: BoolArray) -> bool:
        with np.errstate(divide="ignore", invalid="ignore"):
            left = norms[weights, -1] / norms[weights, 0]
        left = left[np.isfinite(left)]
        return bool(left.size) and statistics.median(left.tolist()) < COLLAPSED

    def check(self, view: HealthView) -> Outcome:
        rule = self.name
        t = self.thresholds
        inp = view.inp
        steps, ratios, norms = inp.update_steps, inp.update_series, inp.param_series
        shape = (len(view.layer_names), steps.size if steps is not None else -1)
        if (
            steps is None
            or ratios is None
            or norms is None
            or ratios.shape != shape
            or norms.shape != shape
            or steps.size < t.sustain_steps + 1
            or not view.has_new_rows
        ):
            return nothing(rule)
        weights = weight_rows(view.layer_names)
        verdict = self._pull(steps, ratios, norms, weights)
        if self._found and verdict.collapsed:
            # Still the same episode: the weights stay collapsed.
            return Outcome(rule, self._found, always, lambda _new: [])
        if verdict.holds is None:
            return nothing(rule)
        if not verdict.enough:
            return clear(rule)
        lo, shrink, r, holds = verdict.lo, verdict.shrink, verdict.r, verdict.holds
        assert shrink is not None and r is not None
        step = float(steps[-1])
        then = _loss_level(view, float(steps[lo]), before=True)
        now_loss = _loss_level(view, step, before=False)
        if not now_loss >= IMPROVED * then:  # NaN: not known, not judged as held
            return clear(rule)
        names = [n for n, w in zip(view.layer_names, weights.tolist(), strict=True) if w]
        held_names = [names[i] for i in np.flatnonzero(holds).tolist()]
        self._found = held_names
        first = norms[weights][:, 0]
        now = norms[weights][:, -1]
        share = statistics.median((now[holds] / first[holds]).tolist())
        per_step = statistics.median(shrink[holds, -1].tolist())
        ratio_now = statistics.median(r[holds, -1].tolist())
        since = int(steps[0])

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    rule,
                    cause="Weight decay is too strong: it pulls every weight towards zero "
                    "faster than the gradient pushes back, so the weights collapse and the "
                    "loss does not improve",
                    said=f"parameter norms at {num(share)} of their size at step {since} in "
                    f"{len(held_names)} of {len(names)} weight layers, shrinking "
                    f"{num(per_step)} a step, {num(per_step / ratio_now)} of each update "
                    f"(||Δw||/||w|| {num(ratio_now)})",
                    evidence={
                        "norm_share_left": share,
                        "since_step": since,
                        "shrink_per_step": per_step,
                        "update_ratio": ratio_now,
                        "pull_share": per_step / ratio_now,
                        "layers_shrinking": len(held_names),
                        "weight_layers": len(names),
                        "step": int(step),
                    },
                    fix="lower weight_decay (AdamW: 0.01 to 0.1 is usual; SGD: 1e-4 to 5e-4), "
                    "or leave biases and norms out of it",
                    layers=held_names,
                    step=int(step),
                    time=view.time_at(step),
                    subject=subjects.LAYERS,
                )
            ]

        # Held for the layers it names (the symptoms it explains are judged on the same ones),
        # one alert for them all: the pull is the optimizer's, not a layer's.
        return Outcome(rule, held_names, always, make)


__all__ = ["WeightDecayTooHigh"]
