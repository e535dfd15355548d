"""Fine-tuning with adapters on a frozen base (hand-written LoRA and the real peft): adapters
that never move, adapters frozen or missing from the optimizer, a base that trains, an adapter
lr far too small."""

from __future__ import annotations

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns
from tests.diagnosis.corpus._common import (
    LoRA,
    Trace,
    adapter_params,
    need,
    pretrained_base,
    with_lora,
)
from torch import nn


def finetune_loop(
    model: nn.Module, opt: torch.optim.Optimizer, steps: int, attach: Attach, watch: nn.Parameter
) -> Trace:
    task, t = Patterns(seed=7), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, watch=watch.detach().abs().max())
        mon.log(loss=loss)
    return t


def lora_a_and_b_zero(steps: int, attach: Attach) -> Trace:
    # Source: github.com/nvidia-cosmos/cosmos-predict2.5/pull/15 ("lora-A initialization all
    # zeros --> No training") and huggingface/peft#793 ("lora_B weights don't get any update
    # and remain equal to zero"): A initialised to zero as well as B.
    # Signal: every lora_A and lora_B stays exactly 0 and gets a zero gradient; the loss does
    # not move from where the frozen base puts it.
    model = with_lora(pretrained_base())
    for p in adapter_params(model):
        nn.init.zeros_(p)  # the bug: A zeroed too (a re-init loop over every lora_ tensor)
    opt = torch.optim.AdamW(adapter_params(model), lr=1e-3)
    return finetune_loop(model, opt, steps, attach, model.fc2.lora_B)  # type: ignore[arg-type]


def check_stays_zero(t: Trace) -> str:
    return need(max(t["watch"]) == 0.0, f"the adapter moved to {max(t['watch']):.3g}")


def adapters_frozen(steps: int, attach: Attach) -> Trace:
    # Source: huggingface/peft#245 and transformers#26098 ("LoRA A and B requires_grad False
    # during training") and the peft ``is_trainable=False`` default of
    # PeftModel.from_pretrained (huggingface/peft#282): here by hand, a "freeze everything but
    # the head" loop run after the adapters were added.
    # Signal: lora_A/lora_B require no grad and never change; only the head trains.
    model = with_lora(pretrained_base())
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("out.")  # the bug: freezes the adapters too
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return finetune_loop(model, opt, steps, attach, model.fc2.lora_A)  # type: ignore[arg-type]


def check_frozen(t: Trace) -> str:
    return need(max(t["watch"]) - min(t["watch"]) == 0.0, "the adapter moved")


def base_not_frozen(steps: int, attach: Attach) -> Trace:
    # Source: the LoRA recipe (base frozen, only A/B train) against hand-written wrappers
    # that forget ``base.requires_grad_(False)`` (PyTorch forum, "LoRA implementation: all
    # parameters still trainable"; peft's print_trainable_parameters exists for this check).
    # Signal: the adapters are there, and every base weight requires grad, is in the
    # optimizer and moves each step.
    base = pretrained_base()
    base.fc1 = LoRA(base.fc1, freeze=False)  # type: ignore[assignment]
    base.fc2 = LoRA(base.fc2, freeze=False)  # type: ignore[assignment]  # the bug
    opt = torch.optim.AdamW(base.parameters(), lr=1e-3)
    start = base.fc1.base.weight.detach().clone()  # type: ignore[union-attr]
    t = finetune_loop(base, opt, steps, attach, base.fc1.lora_B)  # type: ignore[arg-type]
    t.rec(base_moved=(base.fc1.base.weight - start).abs().max())  # type: ignore[union-attr]
    return t


def check_base_moved(t: Trace) -> str:
    return need(t["base_moved"][0] > 1e-3, "the base did not move")


def tiny_peft(target: tuple[str, ...] = ("fc1", "fc2")) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(target), lora_dropout=0.0)
    return get_peft_model(pretrained_base(), config)


def lora_b(model: nn.Module) -> nn.Parameter:
    return next(p for n, p in model.named_parameters() if "fc2.lora_B" in n)


def peft_lr_too_small(steps: int, attach: Attach) -> Trace:
    # Source: huggingface/peft#793 ("Lora model working exactly the same as base model":
    # lora_B did not move) with an lr of 1e-8 (2e-4 intended; a scientific-notation typo
    # from a config file).
    # Signal: the adapters get gradients, yet lora_B stays within 1e-5 of 0 and the loss does
    # not move.
    model = tiny_peft()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-8)  # the bug
    return finetune_loop(model, opt, steps, attach, lora_b(model))


def check_barely_moved(t: Trace) -> str:
    return need(max(t["watch"]) < 1e-5, f"lora_B moved to {max(t['watch']):.3g}")


def peft_optimizer_before_wrap(steps: int, attach: Attach) -> Trace:
    # Source: huggingface/trl#3926 ("SFTTrainer freezes LoRA adapter", grad_norm 0) and
    # huggingface/trl#6700 ("silently no-ops (empty optimizer)"): here the optimizer is built
    # from the base model before get_peft_model adds the adapters; it holds only the
    # (now frozen) base weights.
    # Signal: the adapters require grad and have gradients, yet are in no param group and
    # never change; the optimizer's parameters are all frozen.
    from peft import LoraConfig, get_peft_model

    base = pretrained_base()
    opt = torch.optim.AdamW(base.parameters(), lr=1e-3)  # the bug: built before the wrap
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["fc1", "fc2"], lora_dropout=0.0)
    model = get_peft_model(base, config)
    return finetune_loop(model, opt, steps, attach, lora_b(model))


PEFT_B = "base_model.model.fc2.lora_B.default.weight"

# fmt: off
BROKEN = (
    Scenario("hand_lora_ab_zero", "finetune", "hand LoRA with A zero-initialised as well as B",
             lora_a_and_b_zero, 300, 80, ("adapters_not_learning",), "fc2.lora_B",
             source="nvidia-cosmos/cosmos-predict2.5 PR 15; huggingface/peft#793",
             signal="lora_A and lora_B stay exactly 0 with zero gradients",
             check=check_stays_zero),
    Scenario("hand_lora_frozen_by_head_loop", "finetune",
             "'train only the head' loop run after adding adapters: adapters frozen",
             adapters_frozen, 300, 80, ("adapters_not_trained", "frozen_params_in_optimizer"),
             "fc2.lora_A",
             source="huggingface/peft#245; huggingface/transformers#26098; peft#282",
             signal="lora_A/lora_B require no grad and never change", check=check_frozen),
    Scenario("hand_lora_base_trainable", "finetune",
             "hand LoRA wrapper that does not freeze the base Linear", base_not_frozen, 300, 80,
             ("base_not_frozen",), "fc1.base.weight",
             source="LoRA recipe vs hand wrappers; peft print_trainable_parameters",
             signal="base weights require grad, are stepped and move beside the adapters",
             check=check_base_moved),
    Scenario("peft_lora_lr_1e-8", "finetune", "peft LoRA, AdamW lr=1e-8", peft_lr_too_small,
             300, 80, ("adapter_lr_too_small", "adapters_not_learning"), PEFT_B,
             source="huggingface/peft#793 (lora_B not updated) with a typo'd lr",
             signal="adapters with gradients, lora_B within 1e-5 of 0", check=check_barely_moved),
    Scenario("peft_opt_built_before_wrap", "finetune",
             "optimizer built from the base before get_peft_model", peft_optimizer_before_wrap,
             300, 80, ("adapters_not_trained", "params_not_in_optimizer"), PEFT_B,
             source="huggingface/trl#3926; huggingface/trl#6700",
             signal="adapters with gradients in no param group, lora_B stays 0",
             check=check_stays_zero),
)
# fmt: on
