"""Precision set-ups that lose the gradient, from the optimizer's groups (read when it became
the monitor's) and the autocast state and GradScaler use of sampled steps
(``_capture/probes/structure.py``)."""

from __future__ import annotations

from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.structure import Observation, steady, to_judge
from nbmonitor.health.view import HealthView

LEAST = 2
RECENT = 4


class Fp16ParamsWithAdam(Base):
    name = "fp16_params_with_adam"
    explains = (
        "update_ratio_low",
        "loss_plateau",
        "loss_non_finite",
        "grad_non_finite",
        "update_ratio_high",
        "vanishing_gradients",
        "exploding_gradients",
        "loss_spike",
        "lr_too_low",
        "lr_too_high",
    )
    doc = RuleDoc(
        CAUSE,
        names="the parameters themselves are float16 and trained with an adaptive optimizer "
        "(Adam, AdamW, ...): small updates round to zero and `eps` underflows",
        evidence="the optimizer's class divides by a second moment and its param groups hold "
        "float16 parameters (read from the groups at attach)",
        fix="keep the parameters in float32 and train under `torch.autocast(dtype=torch.float16)`"
        " with a `GradScaler` (or use bfloat16)",
        silent_on=(
            "bfloat16 parameters",
            "float16 autocast over float32 parameters",
            "float16 parameters with SGD",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        structure = to_judge(view)
        if structure is None:
            return nothing(self.name)
        opt = structure.latest("optimizer")
        if opt is None:
            return nothing(self.name)
        half = opt.number("float16_params") or 0
        if not (opt.get("adaptive") is True and half > 0):
            return clear(self.name)
        names = opt.get("float16_names")
        listed = tuple(n for n in names if isinstance(n, str)) if isinstance(names, tuple) else ()
        groups = opt.get("groups")
        eps = None
        if isinstance(groups, tuple) and groups and isinstance(groups[0], tuple):
            eps = groups[0][2]
        step = int(view.step_col[view.new_from]) if view.step_col.size else 0
        said = f"{int(half)} float16 parameter(s) in {opt.get('name')}"
        if isinstance(eps, float):
            said += f"; eps {eps:g}" + (" underflows to 0 in float16" if eps < 6e-8 else "")

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause=f"the parameters are float16 and trained with {opt.get('name')}: "
                    "small updates round to zero and eps underflows",
                    said=said,
                    evidence={
                        "optimizer": opt.get("name"),
                        "float16_params": int(half),
                        "eps": eps,
                        "names": list(listed),
                    },
                    fix="keep the parameters in float32 (`model.float()`) and train under "
                    "`torch.autocast(dtype=torch.float16)` with a `GradScaler`, or use bfloat16",
                    layers=listed,
                    place="the optimizer's param groups",
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


class Fp16WithoutScaler(Base):
    name = "fp16_without_scaler"
    explains = (
        "vanishing_gradients",
        "gradient_not_flowing",
        "update_ratio_low",
        "loss_plateau",
        "grad_non_finite",
        "loss_non_finite",
        "lr_too_low",
    )
    doc = RuleDoc(
        CAUSE,
        names="float16 autocast without a `GradScaler`: small gradients underflow to zero",
        evidence="the training forward runs under float16 autocast and no `GradScaler.scale` "
        "came before its backward, on every sampled step",
        fix="scale the loss with `torch.amp.GradScaler` (`scaler.scale(loss).backward()`, "
        "`scaler.step(optimizer)`, `scaler.update()`), or autocast to bfloat16",
        silent_on=("bf16 autocast", "float16 autocast with a GradScaler"),
    )

    def check(self, view: HealthView) -> Outcome:
        structure = to_judge(view)
        if structure is None:
            return nothing(self.name)
        forward = structure.recent("forward", RECENT, key="device")
        backward = structure.recent("backward", RECENT, key="scaled")
        if len(forward) < LEAST or len(backward) < LEAST:
            return nothing(self.name)

        def half(o: Observation) -> bool:
            return o.get("autocast") == "float16"

        def unscaled(o: Observation) -> bool:
            return o.get("scaled") is False

        if not (steady(forward, LEAST, half) and steady(backward, LEAST, unscaled)):
            return clear(self.name)
        since = [
            structure.held_since("forward", "device", LEAST, half),
            structure.held_since("backward", "scaled", LEAST, unscaled),
        ]
        step = max(s if s is not None else backward[-1].step for s in since)
        step = min(step, int(view.step_col[-1])) if view.step_col.size else step
        device = forward[-1].get("device")

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause="float16 autocast runs without a `GradScaler`: small gradients "
                    "underflow to zero",
                    said=f"the training forward ran under {device} float16 autocast and no loss "
                    f"was scaled before the backward, on {len(backward)} sampled steps",
                    evidence={
                        "autocast": "float16",
                        "device": device,
                        "scaled": False,
                        "steps": [o.step for o in backward],
                    },
                    fix="scale the loss with `torch.amp.GradScaler` (`scaler.scale(loss)"
                    ".backward()`, `scaler.step(optimizer)`, `scaler.update()`), or autocast "
                    "to bfloat16",
                    place="the training loop",
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


__all__ = ["Fp16ParamsWithAdam", "Fp16WithoutScaler"]
