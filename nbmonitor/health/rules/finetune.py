"""Fine-tuning: adapters on a frozen base (LoRA by hand or with peft, IA3, prompts). Subject:
``"layers"`` (the adapter tensors, or the base tensors that train).

Two causes are read from the layout alone (``setup_findings``; held from the first judged rows,
so that the symptoms they explain are taken in): adapters that cannot train (frozen, or missing
from the optimizer) and a base that trains beside its adapters; the static checks at attach
leave the parameters they name out of the generic ``params_not_in_optimizer`` and
``frozen_params_in_optimizer`` (``setup_explained``). Two are judged as the run goes, from the
sampled update steps and the gradient norms (``finetune.AdapterWatch``): adapters whose weights
never move (``AdaptersNotLearning``) and adapters that move, but by far too little a step for
their learning rate to matter (``AdapterLrTooSmall``). A healthy fine-tune (LoRA's B leaves
zero after the first update, a warm-up, dropout, a head trained on purpose) raises none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nbmonitor.health.adapters import Adapters, AdapterTensor
from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.finetune import FIRST_JUDGED, MIN_UPDATES, AdapterWatch, zero_label
from nbmonitor.health.rule import Base, Outcome, always, nothing
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView
from nbmonitor.health.wording import name_list, num

# The base "trains" when more than this share of it is stepped (besides any base weight an
# adapter wraps, which should never train): a few norms or biases trained on purpose do not.
BASE_TRAINS_SHARE = 0.5
# A learning rate below this share of the run's largest is a schedule's decay, not a bug.
DECAYED_LR = 0.01
# The loss is falling when the median of its newest RECENT values is below FALLING x the
# median of the EARLIER values before them.
RECENT, EARLIER, FALLING = 10, 30, 0.9


def _adapter_name(t: AdapterTensor) -> str:
    """peft's adapter name ("default") of a tensor: the name part after its role's part."""
    parts = t.name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "ia3_l",
                    "lora_magnitude_vector", "prompt_encoder", "modules_to_save"):  # fmt: skip
            return parts[i + 1]
    return ""


@dataclass(frozen=True)
class Finding:
    """A setup cause read from the layout: what ``cause_alert`` is given."""

    rule: str
    severity: str
    cause: str
    said: str
    evidence: dict[str, object]
    fix: str
    names: tuple[str, ...]


def setup_findings(ad: Adapters) -> list[Finding]:
    """The setup causes of a fine-tune, read from its layout alone."""
    found: list[Finding] = []
    if ad.method == "trainable part":
        return found
    adapters = ad.adapters
    # peft freezes an adapter that is not the active one on purpose: a name all frozen is
    # a mistake only when no adapter trains at all.
    by_name: dict[str, list[AdapterTensor]] = {}
    for t in adapters:
        by_name.setdefault(_adapter_name(t), []).append(t)
    some_train = any(t.trainable for t in adapters)
    frozen: list[AdapterTensor] = []
    for tensors in by_name.values():
        stuck = [t for t in tensors if not t.trainable]
        if stuck and (len(stuck) < len(tensors) or not some_train):
            frozen += stuck
    known = ad.optimizer_known
    missing = [t for t in adapters if t.trainable and not t.in_optimizer] if known else []
    if frozen or missing:
        names = tuple(t.name for t in frozen + missing)
        parts = []
        if frozen:
            parts.append(f"{ad.count(frozen)} of {len(adapters)} frozen (requires_grad=False)")
        if missing:
            parts.append(f"{ad.count(missing)} not in the optimizer")
        trainable = sum(t.numel for t in ad.training)
        if frozen and not some_train:
            cause = "the adapters are frozen: nothing of them trains"
            fix = (
                "make them trainable: with peft, load with PeftModel.from_pretrained(..., "
                "is_trainable=True), or call get_peft_model after freezing the base; by hand, "
                "freeze the base before adding the adapters"
            )
        elif missing:
            cause = "the adapters are not in the optimizer: it never steps them"
            fix = (
                "build the optimizer after adding the adapters, from the parameters that "
                "require grad: optimizer(p for p in model.parameters() if p.requires_grad)"
            )
        else:
            cause = "some adapter tensors are frozen while the others train"
            fix = "set requires_grad=True on every adapter tensor (A and B alike)"
        found.append(
            Finding(
                "adapters_not_trained",
                "error",
                f"{cause} ({ad.method})",
                "; ".join(parts) + f": {name_list(list(names))}; "
                f"{trainable:,} adapter values can change",
                {
                    "method": ad.method,
                    "frozen": [t.name for t in frozen],
                    "not_in_optimizer": [t.name for t in missing],
                    "adapters": len(adapters),
                    "trainable_adapter_values": trainable,
                },
                fix,
                names,
            )
        )
    base = ad.base_numel
    stepped = ad.base_stepped if known else ad.base_stepped + ad.base_unstepped
    stepped_numel = ad.base_stepped_numel if known else ad.base_trainable_numel
    stepped_count = ad.base_stepped_count + (0 if known else ad.base_unstepped_count)
    share = stepped_numel / base if base else 0.0
    wrapped = [n for n in ad.wrapped_trainable if n in stepped]
    if adapters and (wrapped or share > BASE_TRAINS_SHARE):
        where = (
            f"including the weights the adapters wrap ({name_list(wrapped)})"
            if wrapped
            else f"{share:.0%} of the base"
        )
        found.append(
            Finding(
                "base_not_frozen",
                "error",
                f"the base model trains beside its adapters ({ad.method}): the run is a full "
                "fine-tune, with its memory and its forgetting",
                f"{stepped_count} base tensors ({stepped_numel:,} values) require grad and are "
                f"stepped, {where}, against {ad.adapter_numel:,} adapter values",
                {
                    "method": ad.method,
                    "base_stepped": list(stepped),
                    "base_stepped_tensors": stepped_count,
                    "base_stepped_values": stepped_numel,
                    "base_values": base,
                    "wrapped_trainable": wrapped,
                    "adapter_values": ad.adapter_numel,
                },
                "freeze the base before adding the adapters (model.requires_grad_(False); "
                "peft's get_peft_model does it) and give the optimizer only the parameters "
                "that require grad",
                tuple(stepped),
            )
        )
    elif adapters and known and ad.base_unstepped_count:
        # The base requires grad, but the optimizer holds only the adapters: it does not
        # train, yet every backward computes and keeps its gradients.
        found.append(
            Finding(
                "base_not_frozen",
                "warning",
                f"the base model is not frozen ({ad.method}): it requires grad though the "
                "optimizer holds only the adapters, so its gradients cost memory and time "
                "every step and are never applied",
                f"{ad.base_unstepped_count} base tensors "
                f"({ad.base_trainable_numel:,} values): {name_list(list(ad.base_unstepped))}",
                {
                    "method": ad.method,
                    "base_unstepped": list(ad.base_unstepped),
                    "base_unstepped_tensors": ad.base_unstepped_count,
                    "base_trainable_values": ad.base_trainable_numel,
                },
                "freeze the base (model.requires_grad_(False)) before adding the adapters",
                ad.base_unstepped,
            )
        )
    return found


def setup_explained(ad: Adapters) -> set[str]:
    """The parameters the setup causes name: the generic ``params_not_in_optimizer`` and
    ``frozen_params_in_optimizer`` leave them out (the cause says it, with its fix)."""
    return {n for f in setup_findings(ad) for n in f.names}


class _Setup(Base):
    """A setup cause of a fine-tune, judged from the layout at the first new rows and held
    while the run goes (so that the symptoms it explains are taken in, ``explains``)."""

    def check(self, view: HealthView) -> Outcome:
        ad = view.inp.adapters
        if ad is None or not view.has_new_rows:
            return nothing(self.name)
        found = [f for f in setup_findings(ad) if f.rule == self.name]
        if not found:
            return Outcome(self.name, [], always, lambda _new: [])
        finding = found[0]
        step = int(view.step_col[view.new_from])

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause=finding.cause,
                    said=finding.said,
                    evidence=finding.evidence,
                    fix=finding.fix,
                    step=step,
                    time=view.time_at(step),
                    layers=finding.names,
                    severity=finding.severity,
                )
            ]

        return Outcome(self.name, list(finding.names), always, make)


# Symptoms of adapters that do not change: their gradients are zero or tiny, their updates
# tiny, the loss flat.
STILL = (
    "vanishing_gradients",
    "gradient_not_flowing",
    "update_ratio_low",
    "loss_plateau",
)


class AdaptersNotTrained(_Setup):
    name = "adapters_not_trained"
    explains = (*STILL, "adapters_not_learning", "lr_too_low")
    doc = RuleDoc(
        CAUSE,
        "the adapters are frozen (`requires_grad=False`) or missing from the optimizer",
        "the adapters (peft's `lora_A`/`lora_B`/..., hand-written LoRA by name or by a "
        "low-rank pair beside a frozen weight) and the optimizer's groups, read at attach",
        "build the optimizer after adding the adapters, from the parameters that require grad "
        "(with peft, `is_trainable=True` when loading)",
        (
            "an inactive peft adapter frozen on purpose beside the active one",
            "`AdamW(model.parameters())` holding the frozen base",
        ),
    )


class BaseNotFrozen(_Setup):
    name = "base_not_frozen"
    doc = RuleDoc(
        CAUSE,
        "the base model trains (requires grad, is stepped) beside its adapters",
        "the weights the adapters wrap, or most of the base, require grad and are in the "
        "optimizer (read at attach); a base that requires grad outside the optimizer is "
        "said as memory spent for nothing",
        "freeze the base before adding the adapters and give the optimizer only what requires grad",
        ("peft's `modules_to_save` heads", "a few norms or biases trained on purpose"),
    )


def _training_names(ad: Adapters) -> tuple[str, ...]:
    return tuple(t.name for t in ad.training)


class _Watching(Base):
    """A rule reading the run's ``AdapterWatch`` (one per rule, fed slice by slice)."""

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._watch: AdapterWatch | None = None

    def _watching(self, view: HealthView) -> AdapterWatch | None:
        ad = view.inp.adapters
        if ad is None or not ad.training:
            return None
        if self._watch is None or self._watch.adapters is not ad:
            self._watch = AdapterWatch(ad, self.thresholds.update_ratio_low)
        self._watch.observe(view.inp)
        return self._watch


class AdaptersNotLearning(_Watching):
    name = "adapters_not_learning"
    explains = (*STILL, "lr_too_low")
    doc = RuleDoc(
        CAUSE,
        "the adapter weights do not move: LoRA's B stays at zero (no gradient reaches the "
        "adapters, their gradient is exactly zero, or the optimizer does not apply it)",
        f"the adapters' norms and updates on the sampled steps: none moved over "
        f"{MIN_UPDATES} measured updates (from step {FIRST_JUDGED}); the gradient says which "
        "of the three",
        "with gradient checkpointing, `model.enable_input_require_grads()`; A random and only "
        "B at zero; the optimizer built after the adapters",
        (
            "LoRA's B at zero before its first update",
            "a warm-up from lr 0",
            "dropout in the LoRA config",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        watch = self._watching(view)
        if watch is None or not (view.has_new_rows or view.has_new_layers):
            return nothing(self.name)
        verdict = watch.verdict()
        # No gradient anywhere (no other parameter got one either): the loss is cut from the
        # model, a cause of its own, not the adapters'.
        cut = verdict.grads == "none" and not watch.rest_grads
        if not watch.stuck() or cut:
            return Outcome(self.name, [], always, lambda _new: [])
        ad = watch.adapters
        step = verdict.step
        names = _training_names(ad)
        n_zero = int(watch.zero_mask().sum())
        label = zero_label(watch.zero_roles())
        if n_zero and label in ("A", "B"):
            still = f"LoRA's {label} stays exactly at zero in all {n_zero}"
        elif n_zero:
            still = "the zero-started tensors stay at zero"
        else:
            still = "their weights do not change"
        seen = (
            f"over {verdict.updates} measured updates"
            if verdict.updates
            else f"over {watch.grad_steps} steps"
        )
        if verdict.grads == "none":
            cause = (
                "no gradient reaches the adapters (p.grad is None after backward()): the "
                "forward does not go through them, or gradient checkpointing on a frozen base "
                "cuts them off (its inputs do not require grad)"
            )
            fix = (
                "with gradient checkpointing call model.enable_input_require_grads() (or "
                "checkpoint with use_reentrant=False); otherwise check the adapters are active "
                "(not disabled or merged) in forward"
            )
        elif verdict.grads == "zero" and n_zero == watch.size:
            cause = (
                "the adapters' A and B both start at zero, so each one's gradient is the "
                "other's zero: they never move"
            )
            fix = (
                "initialise A randomly (peft's default; by hand kaiming_uniform_) and only B "
                "at zero"
            )
        elif verdict.grads == "zero":
            cause = "the adapters' gradient is exactly zero: the loss does not depend on them"
            fix = "check that their output is added to the layer's output in forward"
        else:
            cause = "gradients reach the adapters but the optimizer does not change them"
            fix = (
                "build the optimizer after adding the adapters, from the parameters that "
                "require grad, and check its lr is not 0"
            )
        said = f"{ad.count(ad.training)} ({ad.method}): {still} {seen}, " + (
            f"grads {verdict.grads}"
            + (f" (median norm {num(verdict.grad_norm)})" if verdict.grads == "non-zero" else "")
        )
        evidence: dict[str, object] = {
            "method": ad.method,
            "adapters": len(names),
            "measured_updates": verdict.updates,
            "zero_started": n_zero,
            "left_zero": verdict.b_left_zero,
            "grads": verdict.grads,
            "grad_norm": verdict.grad_norm,
            "steps": [FIRST_JUDGED, step],
        }

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause=cause,
                    said=said,
                    evidence=evidence,
                    fix=fix,
                    step=step,
                    time=view.time_at(step),
                    layers=names,
                    severity="error",
                )
            ]

        return Outcome(self.name, [""], always, make)


def _loss_flat(view: HealthView) -> bool:
    """The loss is not falling (or not logged): its newest values are not clearly below the
    ones before them."""
    loss = view.column("loss")
    if loss is None:
        return True
    values = loss[np.isfinite(loss)].tolist()[-(RECENT + EARLIER) :]
    if len(values) < 2 * RECENT:
        return False
    return not statistics.median(values[-RECENT:]) < FALLING * statistics.median(values[:-RECENT])


class AdapterLrTooSmall(_Watching):
    name = "adapter_lr_too_small"
    explains = (*STILL, "lr_too_low")
    doc = RuleDoc(
        CAUSE,
        "the adapters' learning rate is far too small for them to move",
        "the adapters' (LoRA's A) ||Δw||/||w|| a step below `update_ratio_low` (1e-6), or 0 "
        "(the update rounds away), on `sustain_steps` measured updates, with non-zero "
        "gradients and a loss that is not falling",
        "raise the adapters' learning rate (LoRA usually trains at 1e-4 to 1e-3 with AdamW)",
        ("a schedule decayed to near 0 at the end", "a warm-up", "SGD with a loss that falls"),
    )

    def reset(self) -> None:
        super().reset()
        self._lr_max = 0.0

    def _decayed(self, view: HealthView) -> bool:
        lr = view.column("lr")
        if lr is None:
            return False
        seen = lr[np.isfinite(lr)]
        if not seen.size:
            return False
        self._lr_max = max(self._lr_max, float(seen.max()))
        return bool(seen[-1] < DECAYED_LR * self._lr_max)

    def check(self, view: HealthView) -> Outcome:
        watch = self._watching(view)
        t = self.thresholds
        if watch is None or not view.has_new_rows:
            return nothing(self.name)
        ratio = watch.step_ratio()
        kind, grad_norm = watch.grads()
        judged = (
            watch.step >= t.min_history
            and math.isfinite(ratio)
            and kind == "non-zero"
            and watch.ratios_seen() >= t.sustain_steps
        )
        if not judged or self._decayed(view):
            return nothing(self.name)
        if all(t.lr == 0 for t in watch.adapters.training):
            return nothing(self.name)  # lr 0 at attach: lr_zero names it
        if not (ratio < t.update_ratio_low and _loss_flat(view)):
            return Outcome(self.name, [], always, lambda _new: [])
        ad = watch.adapters
        step = watch.step
        lrs = _group_lrs(ad.training)
        horizon = max(view.inp.step, 1000)
        if ratio > 0:
            size = (
                f"||Δw||/||w|| ≈ {num(ratio)} a step, healthy is about 1e-3; "
                f"{num(ratio * horizon)} over {horizon:,} steps"
            )
        else:
            size = "their updates round away to nothing (||Δw|| = 0 at the weights' precision)"
        said = (
            f"{ad.method}, {lrs}: {size}, with non-zero gradients (median norm "
            f"{num(grad_norm)}) and a flat loss"
        )
        evidence: dict[str, object] = {
            "method": ad.method,
            "lr": sorted({t.lr for t in ad.training if math.isfinite(t.lr)}),
            "groups": sorted({t.group for t in ad.training}),
            "update_ratio": ratio,
            "update_ratio_low": t.update_ratio_low,
            "grad_norm": grad_norm,
            "step": step,
        }
        names = _training_names(ad)

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause="the adapters' learning rate is far too small for them to move",
                    said=said,
                    evidence=evidence,
                    fix="raise the adapters' learning rate (LoRA usually trains at 1e-4 to "
                    "1e-3 with AdamW)",
                    step=step,
                    time=view.time_at(step),
                    layers=names,
                )
            ]

        return Outcome(self.name, [""], always, make)


def _group_lrs(tensors: Sequence[AdapterTensor]) -> str:
    """``lr 1e-09 (group 0)``, or several groups'."""
    groups = sorted({(t.group, t.lr) for t in tensors if t.group >= 0})
    if not groups:
        return "lr unknown"
    return ", ".join(f"lr {num(lr) if math.isfinite(lr) else '?'} (group {g})" for g, lr in groups)


__all__ = [
    "AdapterLrTooSmall",
    "AdaptersNotLearning",
    "AdaptersNotTrained",
    "BaseNotFrozen",
    "Finding",
    "setup_explained",
    "setup_findings",
]
