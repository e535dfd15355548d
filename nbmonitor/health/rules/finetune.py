"""Fine-tuning: adapters on a frozen base (LoRA by hand or with peft, IA3, prompts). Subject:
``"layers"`` (the adapter tensors) or ``"setup"``.

Two causes are read from the setup alone, at attach (``setup_alerts``, called by the static
checks): adapters that cannot train (frozen, or missing from the optimizer) and a base that
trains beside its adapters. Two are judged as the run goes, from the sampled update steps and
the gradient norms (``finetune.AdapterWatch``): adapters whose weights never move
(``AdaptersNotLearning``) and adapters that move, but by far too little a step for their
learning rate to matter (``AdapterLrTooSmall``). A healthy fine-tune (LoRA's B leaves zero after
the first update, a warm-up, dropout, a head trained on purpose) raises none of them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

from nbmonitor.health import alert as subjects
from nbmonitor.health.adapters import Adapters, AdapterTensor
from nbmonitor.health.alert import Alert
from nbmonitor.health.finetune import AdapterWatch
from nbmonitor.health.rule import Base, Outcome, always, nothing
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import View
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


def setup_alerts(
    ad: Adapters, has_optimizer: bool, step: int, time: float
) -> tuple[list[Alert], set[str]]:
    """The setup causes of a fine-tune, and the parameter names they explain (the generic
    ``params_not_in_optimizer``/``frozen_params_in_optimizer`` leave those out)."""
    alerts: list[Alert] = []
    explained: set[str] = set()
    if ad.method == "trainable part":
        return alerts, explained
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
    missing = [t for t in adapters if t.trainable and not t.in_optimizer] if has_optimizer else []
    if frozen or missing:
        names = [t.name for t in frozen + missing]
        explained.update(names)
        parts = []
        if frozen:
            parts.append(f"{ad.count(frozen)} of {len(adapters)} are frozen (requires_grad=False)")
        if missing:
            parts.append(f"{ad.count(missing)} are not in the optimizer")
        trainable = sum(t.numel for t in adapters if t.trainable and t.in_optimizer)
        if frozen and not some_train:
            fix = (
                "Make them trainable: with peft, load with PeftModel.from_pretrained(..., "
                "is_trainable=True) (or get_peft_model after any requires_grad_(False) on the "
                "model); by hand, freeze the base before adding the adapters."
            )
        elif missing:
            fix = (
                "Build the optimizer after adding the adapters, from the parameters that "
                "require grad: optimizer(p for p in model.parameters() if p.requires_grad)."
            )
        else:
            fix = "Set requires_grad=True on every adapter tensor (A and B alike)."
        alerts.append(
            Alert(
                "adapters_not_trained",
                "error",
                f"The adapters are not trained ({ad.method}): "
                + "; ".join(parts)
                + f": {name_list(names)}. {trainable:,} adapter parameters will change. "
                + fix,
                step,
                time,
                tuple(names),
                subject=subjects.SETUP,
            )
        )
    base = ad.base_numel
    stepped_share = ad.base_stepped_numel / base if base else 0.0
    wrapped_stepped = [n for n in ad.wrapped_trainable if n in ad.base_stepped]
    if adapters and (wrapped_stepped or stepped_share > BASE_TRAINS_SHARE):
        names = list(ad.base_stepped)
        explained.update(ad.base_stepped)
        where = (
            f"including the weights the adapters wrap ({name_list(wrapped_stepped)})"
            if wrapped_stepped
            else f"{stepped_share:.0%} of the base's parameters"
        )
        alerts.append(
            Alert(
                "base_not_frozen",
                "error",
                f"The base model trains beside its adapters ({ad.method}): "
                f"{ad.base_stepped_count} base parameter tensors "
                f"({ad.base_stepped_numel:,} values) require grad and are in the optimizer, "
                f"{where}, against {ad.adapter_numel:,} adapter values: the run is a full "
                "fine-tune, with its memory and its forgetting. Freeze the base before adding "
                "the adapters (model.requires_grad_(False); peft's get_peft_model does it) and "
                "give the optimizer only the parameters that require grad.",
                step,
                time,
                tuple(names),
                subject=subjects.SETUP,
            )
        )
    elif adapters and ad.base_unstepped_count and ad.base_trainable_numel > ad.adapter_numel:
        # The base requires grad, but the optimizer holds only the adapters: it does not
        # train, yet every backward computes and keeps its gradients.
        explained.update(ad.base_unstepped)
        alerts.append(
            Alert(
                "base_not_frozen",
                "warning",
                f"The base model is not frozen ({ad.method}): {ad.base_unstepped_count} base "
                f"parameter tensors ({ad.base_trainable_numel:,} values) require grad though "
                f"the optimizer holds only the adapters: {name_list(list(ad.base_unstepped))}. "
                "Their gradients cost memory and time every step and are never applied. "
                "Freeze the base (model.requires_grad_(False)) before adding the adapters.",
                step,
                time,
                tuple(ad.base_unstepped),
                subject=subjects.SETUP,
            )
        )
    return alerts, explained


def _training_names(ad: Adapters) -> tuple[str, ...]:
    return tuple(t.name for t in ad.training)


class _Watching(Base):
    """A rule reading the run's ``AdapterWatch`` (one per rule, fed slice by slice)."""

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.reset()

    def reset(self) -> None:
        self._watch: AdapterWatch | None = None

    def _watching(self, view: View) -> AdapterWatch | None:
        ad = view.inp.adapters
        if ad is None or not ad.training:
            return None
        if self._watch is None or self._watch.adapters is not ad:
            self._watch = AdapterWatch(ad, self.thresholds.update_ratio_low)
        self._watch.observe(view.inp)
        return self._watch


class AdaptersNotLearning(_Watching):
    name = "adapters_not_learning"

    def check(self, view: View) -> Outcome:
        watch = self._watching(view)
        if watch is None or not (view.has_new_rows or view.has_new_layers):
            return nothing(self.name)
        held = [""] if watch.stuck() else []
        if not held:
            return Outcome(self.name, held, always, lambda _new: [])
        ad = watch.adapters
        verdict = watch.verdict()
        step = verdict.step
        names = _training_names(ad)
        what = f"{ad.count(ad.training)} ({ad.method})"
        zero = watch.zero_started()
        if zero and {a.tensor.role for a in zero} <= {"B"}:
            still = f"LoRA's B stays exactly at zero in all {len(zero)}"
        elif zero:
            still = "the zero-started tensors stay at zero"
        else:
            still = "their weights do not change"
        seen = (
            f"over {verdict.updates} measured updates"
            if verdict.updates
            else f"over {watch.grad_steps} steps"
        )
        if verdict.grads == "none":
            why = (
                "and no gradient reaches them (p.grad is None after backward()): the forward "
                "does not go through them, or gradient checkpointing on a frozen base cuts "
                "them off (its inputs do not require grad). With gradient checkpointing call "
                "model.enable_input_require_grads() (or checkpoint with use_reentrant=False); "
                "otherwise check the adapters are active (not disabled or merged) in forward."
            )
        elif verdict.grads == "zero":
            all_zero = len(zero) == len(watch.accounts)
            why = (
                "and their gradient is exactly zero: A and B both start at zero, so each "
                "one's gradient is the other's zero. Initialise A randomly (peft's default; by "
                "hand nn.init.kaiming_uniform_) and only B at zero."
                if all_zero
                else "and their gradient is exactly zero: the loss does not depend on them. "
                "Check that their output is added to the layer's output in forward."
            )
        else:
            why = (
                f"although gradients reach them (median norm {num(verdict.grad_norm)}): the "
                "optimizer does not change them. Build the optimizer after adding the "
                "adapters, from the parameters that require grad, and check its lr is not 0."
            )
        message = f"The adapters are not learning: {what}: {still} {seen}, {why}"

        def make(_new: list[str]) -> list[Alert]:
            return [
                Alert(
                    self.name,
                    "error",
                    message,
                    step,
                    view.time_at(step),
                    names,
                    subject=subjects.LAYERS,
                )
            ]

        return Outcome(self.name, held, always, make)


def _loss_flat(view: View) -> bool:
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

    def reset(self) -> None:
        super().reset()
        self._lr_max = 0.0

    def _decayed(self, view: View) -> bool:
        lr = view.column("lr")
        if lr is None:
            return False
        seen = lr[np.isfinite(lr)]
        if not seen.size:
            return False
        self._lr_max = max(self._lr_max, float(seen.max()))
        return bool(seen[-1] < DECAYED_LR * self._lr_max)

    def check(self, view: View) -> Outcome:
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
            and min((len(a.ratios) for a in watch.others() if a.ratios), default=0)
            >= t.sustain_steps
        )
        if not judged or self._decayed(view):
            return nothing(self.name)
        held = [""] if ratio < t.update_ratio_low and _loss_flat(view) else []
        if not held:
            return Outcome(self.name, held, always, lambda _new: [])
        ad = watch.adapters
        step = watch.step
        lrs = _group_lrs(ad.training)
        runs = view.inp.step if view.inp.step > 1000 else 1000
        message = (
            f"The adapters' learning rate is far too small for them to move ({ad.method}, "
            f"{lrs}): each step changes them by ||Δw||/||w|| ≈ {num(ratio)} (healthy is about "
            f"1e-3; {num(ratio * runs)} over {runs:,} steps) although their gradients are "
            f"non-zero (median norm {num(grad_norm)}), and the loss is flat. Raise the "
            "adapters' learning rate (LoRA usually trains at 1e-4 to 1e-3 with AdamW)."
        )
        names = _training_names(ad)

        def make(_new: list[str]) -> list[Alert]:
            return [
                Alert(
                    self.name,
                    "warning",
                    message,
                    step,
                    view.time_at(step),
                    names,
                    subject=subjects.LAYERS,
                )
            ]

        return Outcome(self.name, held, always, make)


def _group_lrs(tensors: Sequence[AdapterTensor]) -> str:
    """``lr 1e-09 (group 0)``, or several groups'."""
    groups = sorted({(t.group, t.lr) for t in tensors if t.group >= 0})
    if not groups:
        return "lr unknown"
    return ", ".join(f"lr {num(lr) if math.isfinite(lr) else '?'} (group {g})" for g, lr in groups)


__all__ = ["AdapterLrTooSmall", "AdaptersNotLearning", "setup_alerts"]
