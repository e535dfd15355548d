"""What the loss's autograd graph says, read from its root's ``grad_fn`` chain on sampled steps
(``_capture/probes/structure.py``): probabilities fed to a loss that wants logits, a loss that
sums over the batch, a loss cut from every parameter of the model."""

from __future__ import annotations

import numpy as np

from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.structure import Observation, Structure, observed, steady
from nbmonitor.health.view import HealthView

# Sampled steps a verdict rests on (the graph is the same every iteration; two rule out a
# one-off backward of something else).
LEAST = 2
RECENT = 4

_WHAT = {
    "cross_entropy": ("softmax", "`cross_entropy` (which applies `log_softmax` itself)"),
    "nll_loss": ("softmax", "`nll_loss` (which expects `log_softmax` output)"),
    "binary_cross_entropy_with_logits": (
        "sigmoid",
        "`BCEWithLogitsLoss` (which applies the sigmoid itself)",
    ),
}


def _when(since: int | None, obs: tuple[Observation, ...], view: HealthView) -> int:
    """Where the streak of observations reached its count, never past the newest row."""
    newest = int(view.step_col[-1]) if view.step_col.size else obs[-1].step
    return min(since if since is not None else obs[-1].step, newest)


def _probabilities(o: Observation) -> bool:
    return o.get("probabilities_into") is not None


def _modules(structure: Structure, key: str) -> tuple[str, ...]:
    model = structure.latest("model")
    found = model.get(key) if model is not None else None
    return tuple(n for n in found if isinstance(n, str)) if isinstance(found, tuple) else ()


class SoftmaxBeforeCrossEntropy(Base):
    name = "softmax_before_cross_entropy"
    explains = (
        "loss_plateau",
        "vanishing_gradients",
        "update_ratio_low",
        "dead_units",
        "lr_too_low",
    )
    doc = RuleDoc(
        CAUSE,
        names="probabilities (a softmax, or a sigmoid before `BCEWithLogitsLoss`) are passed "
        "where the loss expects logits",
        evidence="in the loss's autograd graph a `Softmax` node feeds `LogSoftmax`/`NllLoss` "
        "(or a `Sigmoid` feeds `BinaryCrossEntropyWithLogits`), through reshapes only",
        fix="pass the logits to the loss: drop the softmax (or sigmoid) at the model's output",
        silent_on=(
            "`log_softmax` + `nll_loss`",
            "`cross_entropy` on logits",
            "`sigmoid` + `BCELoss`",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        seen = observed(view, "backward", RECENT, LEAST, key="root")
        if seen is None:
            return nothing(self.name)
        structure, obs = seen
        if not steady(obs, LEAST, _probabilities):
            return clear(self.name)
        loss = str(obs[-1].get("probabilities_into"))
        kind, what = _WHAT.get(loss, ("softmax", f"`{loss}`"))
        modules = _modules(structure, f"{kind}_modules")
        # The module that makes them, when the model has one of that kind (else it is a call
        # in forward or in the loop).
        place = modules[-1] if modules else "the model's output"
        step = _when(structure.held_since("backward", "root", LEAST, _probabilities), obs, view)

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause=f"{kind} probabilities are passed to {what}, which expects logits",
                    said=f"the loss's graph has a {kind} feeding `{loss}` on {len(obs)} sampled "
                    "steps",
                    evidence={
                        "loss": loss,
                        "activation": kind,
                        "module": place,
                        "steps": [o.step for o in obs],
                    },
                    fix=f"pass the logits to the loss: remove the {kind} before it",
                    layers=(place,) if modules else (),
                    place=place,
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


# A loss summed over the batch scales the gradient with the batch size; the steps it makes are
# then too large when the optimizer is not adaptive. Judged only with a sign of harm: the loss
# not finite, climbing, or update ratios far above healthy (~1e-3) while the loss does not
# fall (large steps that bring the loss down are an lr scaled for the sum, or a fresh model).
UPDATE_RATIO_LARGE = 1e-2
CLIMB = 1.5  # the loss's newest quarter above this multiple of its first quarter
FALLING = 0.9  # the loss's newest quarter below this multiple of its first quarter


def _too_large_steps(view: HealthView) -> dict[str, object]:
    """Signs that the steps are far too large, as evidence (empty: none)."""
    out: dict[str, object] = {}
    loss = view.column("loss")
    falling = True  # unknown: no sign from the update ratios alone
    if loss is not None:
        new = loss[view.new_from :]
        if new.size and (~np.isfinite(new)).any():
            out["loss_not_finite_at"] = int(view.step_col[view.new_from :][~np.isfinite(new)][0])
        finite = loss[np.isfinite(loss)]
        if finite.size >= 8:
            q = finite.size // 4
            first, last = float(np.median(finite[:q])), float(np.median(finite[-q:]))
            falling = last < FALLING * first
            if first > 0 and last > CLIMB * first:
                out["loss_first_quarter"] = first
                out["loss_last_quarter"] = last
    ratios = view.inp.update_ratios
    adapters = view.inp.adapters
    if ratios is not None and ratios.size and adapters is not None and adapters.starts_at_zero:
        # LoRA's B grows from zero: its ratio is ~1/step by design.
        zero = adapters.starts_at_zero
        keep = [name not in zero for name in view.layer_names]
        ratios = ratios[np.asarray(keep, dtype=bool)] if len(keep) == ratios.size else ratios
    if ratios is not None and ratios.size and not falling:
        finite_r = ratios[np.isfinite(ratios)]
        if finite_r.size and float(np.median(finite_r)) > UPDATE_RATIO_LARGE:
            out["update_ratio_median"] = float(np.median(finite_r))
    return out


class LossSumReduction(Base):
    name = "loss_sum_reduction"
    explains = (
        "loss_non_finite",
        "exploding_gradients",
        "update_ratio_high",
        "loss_spike",
        "gradient_spike",
        "grad_non_finite",
        "lr_too_high",
        "clipping_active",
    )
    doc = RuleDoc(
        CAUSE,
        names='the loss sums over the batch (`reduction="sum"`): its gradient scales with the '
        "batch size, so an lr tuned for a mean is far too large",
        evidence="the loss node in the autograd graph saved `reduction=sum` and the batch has "
        "more than one sample, while the steps are too large (loss not finite or climbing, or "
        "update ratios far above 1e-3 while the loss does not fall)",
        fix='use `reduction="mean"` (or divide the lr by the batch size)',
        silent_on=("a summed loss that trains (Adam, or an lr scaled for it)",),
    )

    def check(self, view: HealthView) -> Outcome:
        seen = observed(view, "backward", RECENT, LEAST, key="root")
        if seen is None:
            return nothing(self.name)
        structure, obs = seen
        if not steady(obs, LEAST, lambda o: o.get("reduction") == "sum"):
            return clear(self.name)
        forward = structure.latest("forward")
        shape = forward.get("input_shape") if forward is not None else None
        batch = shape[0] if isinstance(shape, tuple) and shape else None
        if isinstance(batch, int) and batch <= 1:
            return clear(self.name)
        signs = _too_large_steps(view)
        if not signs:
            return clear(self.name)
        node = str(obs[-1].get("loss_node") or "the loss")
        bad = signs.get("loss_not_finite_at")
        step = bad if isinstance(bad, int) else int(view.step_col[-1])
        said = f"`{node.removesuffix('Backward0')}` sums over the batch"
        if isinstance(batch, int):
            said += f" of {batch}"
        said += ", and the steps are too large: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.3g}"
            if isinstance(v, float)
            else f"{k.replace('_', ' ')} {v}"
            for k, v in signs.items()
        )

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause='the loss sums over the batch (`reduction="sum"`): its gradient '
                    "grows with the batch size, so the lr is far too large for it",
                    said=said,
                    evidence={"loss_node": node, "reduction": "sum", "batch": batch, **signs},
                    fix='use `reduction="mean"` (or divide the lr by the batch size)',
                    place="the loss",
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


class LossDetached(Base):
    name = "loss_detached"
    explains = (
        "gradient_not_flowing",
        "loss_plateau",
        "update_ratio_low",
        "vanishing_gradients",
        "lr_too_low",
        "adapters_not_learning",
    )
    doc = RuleDoc(
        CAUSE,
        names="the loss `backward()` is called on is cut from the model (`.detach()`, "
        "`torch.tensor(loss.item(), requires_grad=True)`, a forward under `torch.no_grad()`): "
        "no parameter gets a gradient",
        evidence="the backward's root has no `grad_fn` (a leaf), or its whole graph was walked "
        "without reaching one parameter of the model, on every sampled step",
        fix="call `backward()` on the loss computed from the model's output, without "
        "`.detach()`, `.item()` or `torch.no_grad()` in between",
        silent_on=("a deliberately frozen part (the rest still reached)",),
    )

    def check(self, view: HealthView) -> Outcome:
        seen = observed(view, "backward", RECENT, LEAST, key="reached")
        if seen is None:
            return nothing(self.name)
        structure, obs = seen

        def cut(o: Observation) -> bool:
            if (o.number("reached") or 0) > 0:
                return False
            return o.get("leaf_root") is True or o.get("complete") is True

        if not steady(obs, LEAST, cut):
            return clear(self.name)
        leaf = obs[-1].get("leaf_root") is True
        step = _when(structure.held_since("backward", "reached", LEAST, cut), obs, view)
        said = (
            "the tensor `backward()` is called on is a leaf with no graph"
            if leaf
            else f"its graph ({obs[-1].get('nodes')} nodes) reaches no parameter of the model"
        )
        said += f", on {len(obs)} sampled steps"

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause="the loss is cut from the model: no parameter gets a gradient",
                    said=said,
                    evidence={
                        "leaf_root": leaf,
                        "parameters_reached": 0,
                        "steps": [o.step for o in obs],
                    },
                    fix="call `backward()` on the loss computed from the model's output, "
                    "without `.detach()`, `.item()` or `torch.no_grad()` in between",
                    place="the loss",
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


__all__ = ["LossDetached", "LossSumReduction", "SoftmaxBeforeCrossEntropy"]
