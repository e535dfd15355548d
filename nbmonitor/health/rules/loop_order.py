"""The order of ``zero_grad()``, ``backward()`` and ``step()`` in the loop, from what the
training side read without a sync on sampled steps (``_capture/probes/structure.py``): whether
a parameter's ``.grad`` at the first backward after a step is still the tensor that step left,
unchanged (never reset), whether it is gone when ``step()`` starts (reset after the backward),
and whether a backward starts with no forward since the last step (``step()`` came first).
"""

from __future__ import annotations

import math

import numpy as np

from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.structure import Observation, observed, steady, to_judge
from nbmonitor.health.view import HealthView
from nbmonitor.health.wording import num

# Sampled steps a verdict rests on: each is an observation of the loop's order, which does not
# change from one iteration to the next; two in a row rule out a one-off (a step taken by
# hand between epochs), and the first 8 steps are all sampled.
LEAST = 3
RECENT = 4
# The symptoms a wrong order produces, which the cause explains when it holds.
_GROWING = (
    "exploding_gradients",
    "gradient_spike",
    "loss_plateau",
    "loss_spike",
    "loss_non_finite",
    "grad_non_finite",
    "update_ratio_high",
    "clipping_active",
    "lr_too_high",
)
_NO_GRADIENT = (
    "gradient_not_flowing",
    "loss_plateau",
    "update_ratio_low",
    "vanishing_gradients",
    "lr_too_low",
    "adapters_not_learning",
)


def grad_norm_trend(view: HealthView) -> tuple[float, float, int, int] | None:
    """The total gradient norm at the first and the last finite row the check sees, and
    their steps."""
    col = view.column("grad_norm")
    if col is None:
        return None
    idx = np.flatnonzero(np.isfinite(col))
    if idx.size < 2:
        return None
    a, b = int(idx[0]), int(idx[-1])
    return float(col[a]), float(col[b]), int(view.step_col[a]), int(view.step_col[b])


def _when(since: int | None, obs: tuple[Observation, ...], view: HealthView) -> int:
    """The step a verdict is stamped at: where its streak of observations reached its
    count (``Structure.held_since``), never past the newest row."""
    newest = int(view.step_col[-1]) if view.step_col.size else obs[-1].step
    return min(since if since is not None else obs[-1].step, newest)


class ZeroGradMissing(Base):
    name = "zero_grad_missing"
    explains = _GROWING
    doc = RuleDoc(
        CAUSE,
        names="`optimizer.zero_grad()` (or `model.zero_grad()`) is never called: gradients add "
        "up across steps",
        evidence="at the first backward after a step, a parameter's `.grad` is still the tensor "
        "that step left, unchanged (`_version`), on every sampled step; the grad norm grows with "
        "the step",
        fix="call `optimizer.zero_grad()` once per iteration, before `loss.backward()`",
        silent_on=(
            "gradient accumulation (several backwards per step, `zero_grad` after the step)",
            "`zero_grad(set_to_none=False)`",
            "`model.zero_grad()` instead of the optimizer's",
            "the HF Trainer and Lightning",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        seen = observed(view, "backward", RECENT, LEAST, key="grads_kept")
        if seen is None:
            return nothing(self.name)
        structure, obs = seen

        def kept(o: Observation) -> bool:
            return o.get("grads_kept") is True

        # A forgotten zero_grad leaves a growing gradient, never an exactly zero one (the
        # gradients zeroed in place before step() look unchanged at the next backward).
        if not steady(obs, LEAST, kept) or _zero_norms(view) is not None:
            return clear(self.name)
        step = _when(structure.held_since("backward", "grads_kept", LEAST, kept), obs, view)
        trend = grad_norm_trend(view)
        said = (
            "the gradients were never reset between a step and the next backward, on "
            f"{len(obs)} sampled steps"
        )
        evidence: dict[str, object] = {"grads_kept_at_steps": [o.step for o in obs]}
        if trend is not None:
            first, last, a, b = trend
            said += f"; grad norm {num(first)} → {num(last)} over steps {a}-{b}"
            evidence.update(grad_norm=[first, last], steps=[a, b])

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause="`optimizer.zero_grad()` is never called: gradients add up across steps",
                    said=said,
                    evidence=evidence,
                    fix="call `optimizer.zero_grad()` once per iteration, before `loss.backward()`",
                    place="the training loop",
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


class ZeroGradAfterBackward(Base):
    name = "zero_grad_after_backward"
    explains = _NO_GRADIENT
    doc = RuleDoc(
        CAUSE,
        names="`zero_grad()` is called between `backward()` and `step()`: every step applies no "
        "gradient",
        evidence="a parameter the loss reaches has a gradient after the backward and none when "
        "`optimizer.step()` starts, on every sampled step (or, zeroed in place, its gradient "
        "was written in place after the backward beyond clipping and unscaling, and the total "
        "grad norm is exactly 0)",
        fix="call `optimizer.zero_grad()` before `loss.backward()` (or after `optimizer.step()`)",
        silent_on=(
            "`zero_grad` at the start or the end of the iteration",
            "Lightning's closure",
            "`clip_grad_value_` / `clip_grad_norm_` between backward and step",
            "adapters whose gradient is exactly 0 (LoRA A and B at zero)",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        structure = to_judge(view)
        if structure is None:
            return nothing(self.name)
        obs = structure.recent("pre_step", RECENT, key="grad_present")
        backward = structure.recent("backward", RECENT)
        connected = steady(
            backward, 2, lambda o: o.get("forwarded") is True and (o.number("reached") or 0) > 0
        )
        gone = steady(obs, LEAST, _gone)
        # Zeroed in place (set_to_none=False): the gradient was written in place after the
        # backward beyond what clipping and unscaling do, and the total norm is exactly 0
        # (either alone is healthy: clip_grad_value_, adapters whose gradient is 0).
        rewritten = steady(obs, LEAST, lambda o: o.get("rewritten") is True)
        zeros = _zero_norms(view) if rewritten else None
        if not connected or not (gone or zeros is not None):
            return clear(self.name) if len(obs) >= LEAST else nothing(self.name)
        step = _when(
            structure.held_since("pre_step", "grad_present", LEAST, _gone)
            if gone
            else _zeros_since(view),
            obs if gone else backward,
            view,
        )
        if gone:
            said = (
                f"the gradients the backward left were gone when `optimizer.step()` started, on "
                f"{len(obs)} sampled steps"
            )
        else:
            said = (
                f"the total gradient norm is exactly 0 on {zeros} of the recent steps, while "
                "the loss reaches the parameters"
            )

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause="`zero_grad()` is called between `backward()` and `step()`: every "
                    "step applies no gradient",
                    said=said,
                    evidence={
                        "grads_gone_at_steps": [o.step for o in obs] if gone else [],
                        "zero_grad_norm_steps": zeros or 0,
                    },
                    fix="call `optimizer.zero_grad()` before `loss.backward()`, not between it "
                    "and `optimizer.step()`",
                    place="the training loop",
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


def _gone(o: Observation) -> bool:
    return o.get("grad_present") is False


def _zeros_since(view: HealthView, least: int = 3) -> int | None:
    """The step of the ``least``-th row whose total gradient norm is exactly 0."""
    col = view.column("grad_norm")
    if col is None:
        return None
    at = np.flatnonzero(col == 0)
    return int(view.step_col[at[least - 1]]) if at.size >= least else None


def _zero_norms(view: HealthView, least: int = 3) -> int | None:
    """How many of the rows the check sees have a total gradient norm of exactly 0, when
    nearly all do (a healthy backward never gives an exactly zero gradient to every
    parameter)."""
    col = view.column("grad_norm")
    if col is None:
        return None
    finite = col[np.isfinite(col)]
    if finite.size < least:
        return None
    zeros = int((finite == 0).sum())
    return zeros if zeros >= math.ceil(0.9 * finite.size) else None


class StepBeforeBackward(Base):
    name = "step_before_backward"
    explains = _NO_GRADIENT
    doc = RuleDoc(
        CAUSE,
        names="`optimizer.step()` runs before `loss.backward()` in the iteration: each step "
        "applies no gradient, or the previous batch's",
        evidence="the backward starts with no forward of the model since the last "
        "`optimizer.step()`, and its graph reaches the model's parameters, on every sampled step",
        fix="call `loss.backward()` before `optimizer.step()`",
        silent_on=("`step(closure)` (Lightning, LBFGS)", "evaluation passes under `no_grad`"),
    )

    def check(self, view: HealthView) -> Outcome:
        seen = observed(view, "backward", RECENT, LEAST, key="forwarded")
        if seen is None:
            return nothing(self.name)
        structure, obs = seen

        def first(o: Observation) -> bool:
            return o.get("forwarded") is False and (o.number("reached") or 0) > 0

        if not steady(obs, LEAST, first):
            return clear(self.name)
        step = _when(structure.held_since("backward", "forwarded", LEAST, first), obs, view)

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause="`optimizer.step()` runs before `loss.backward()`: each step applies "
                    "no gradient, or the previous batch's",
                    said=f"the backward started after `optimizer.step()` with no forward since, "
                    f"on {len(obs)} sampled steps",
                    evidence={"backward_after_step_at_steps": [o.step for o in obs]},
                    fix="call `loss.backward()` before `optimizer.step()`",
                    place="the training loop",
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


__all__ = ["StepBeforeBackward", "ZeroGradAfterBackward", "ZeroGradMissing"]
