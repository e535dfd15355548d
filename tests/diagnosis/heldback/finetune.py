"""Held back. Fine-tuning with adapters: other models and other ways to get it wrong."""

from __future__ import annotations

import tempfile
import warnings

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns
from tests.diagnosis.corpus._common import LoRA, Trace, need
from torch import nn
from torch.utils.checkpoint import checkpoint


class Encoder(nn.Module):
    """A small 'pretrained' encoder + classifier with named projections for adapters."""

    def __init__(self) -> None:
        super().__init__()
        self.checkpointing = False
        self.proj_in = nn.Linear(12, 24)
        self.mix = nn.Linear(24, 24)
        self.proj_out = nn.Linear(24, 24)
        self.classifier = nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.proj_in(x))
        # activation checkpointing (the reentrant variant) when asked
        h = checkpoint(self.mixing, h, use_reentrant=True) if self.checkpointing else self.mixing(h)
        return self.classifier(torch.tanh(self.proj_out(h)))

    def mixing(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.mix(h))


def encoder(seed: int = 91) -> Encoder:
    g = torch.Generator().manual_seed(seed)
    model = Encoder()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=g))
    return model


def lora_config() -> object:
    from peft import LoraConfig

    return LoraConfig(r=2, lora_alpha=4, target_modules=["mix", "proj_out"], lora_dropout=0.0)


def loop(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    steps: int,
    attach: Attach,
    watch: torch.Tensor,
    before: object = None,
) -> Trace:
    task, t = Patterns(classes=3, shape=(12,), noise=0.5, seed=92), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        if callable(before):
            before(x)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, watch=watch.detach().abs().max())
        mon.log(loss=loss)
    return t


def named(model: nn.Module, part: str) -> nn.Parameter:
    return next(p for n, p in model.named_parameters() if part in n)


def peft_checkpointing_without_input_grads(steps: int, attach: Attach) -> Trace:
    # Source: locuslab/open-unlearning#178 ("PEFT LoRA transformer layers not trained when
    # gradient_checkpointing=True: enable_input_require_grads() missing", lora_B all zero),
    # huggingface/transformers#26221, lm-sys/FastChat#581: reentrant checkpointing of a block
    # whose input comes from a frozen layer: torch's checkpoint sees no input requiring grad
    # and the adapters inside get no gradient. Its UserWarning scrolls past in a notebook.
    # Signal: mix's adapters require grad and are in the optimizer, yet get no gradient;
    # mix.lora_B stays exactly 0 (proj_out's adapters, after the block, do learn).
    from peft import get_peft_model

    base = encoder()
    base.checkpointing = True  # the bug, with no enable_input_require_grads()
    model = get_peft_model(base, lora_config())  # type: ignore[arg-type]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*requires_grad=True.*")
        return loop(model, opt, steps, attach, named(model, "mix.lora_B"))


def peft_everything_unfrozen(steps: int, attach: Attach) -> Trace:
    # Source: peft's "print_trainable_parameters" checks and threads where a
    # ``for p in model.parameters(): p.requires_grad = True`` (copied from a full
    # fine-tuning script, or to silence "element 0 of tensors does not require grad") runs
    # after get_peft_model: the whole base trains beside the adapters.
    # Signal: adapters present, and every base weight requires grad, is stepped and moves.
    from peft import get_peft_model

    model = get_peft_model(encoder(), lora_config())  # type: ignore[arg-type]
    for p in model.parameters():
        p.requires_grad = True  # the bug
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    base = named(model, "mix.base_layer.weight")
    start = base.detach().clone()
    t = loop(model, opt, steps, attach, named(model, "mix.lora_B"))
    t.rec(base_moved=(base - start).abs().max())
    return t


def hand_lora_group_lr(steps: int, attach: Attach) -> Trace:
    # Source: huggingface/peft#793 (adapters that do not move) in its param-group form:
    # separate groups for the new classifier (lr 1e-3) and the adapters, whose lr was typed
    # 1e-9 (meant 1e-4).
    # Signal: the adapters have gradients, yet lora_B stays within 1e-7 of 0; the classifier
    # learns alone.
    model = encoder()
    for p in model.parameters():
        p.requires_grad_(False)
    model.mix = LoRA(model.mix, rank=2)  # type: ignore[assignment]
    model.proj_out = LoRA(model.proj_out, rank=2)  # type: ignore[assignment]
    model.classifier = nn.Linear(24, 3)
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    opt = torch.optim.Adam(
        [
            {"params": model.classifier.parameters(), "lr": 1e-3},
            {"params": adapters, "lr": 1e-9},  # the bug
        ]
    )
    return loop(model, opt, steps, attach, model.proj_out.lora_B)  # type: ignore[arg-type]


def peft_loaded_not_trainable(steps: int, attach: Attach) -> Trace:
    # Source: huggingface/peft#282 ("No Trainable Parameters when PeftModel.from_pretrained()":
    # the adapter loads frozen, is_trainable=False by default) and huggingface/trl#6700: a
    # saved adapter reloaded to continue training, a fresh classifier head unfrozen on top.
    # Signal: lora_A/lora_B require no grad and never change; only the classifier trains.
    from peft import PeftModel, get_peft_model

    with tempfile.TemporaryDirectory() as folder:
        get_peft_model(encoder(), lora_config()).save_pretrained(folder)  # type: ignore[arg-type]
        model = PeftModel.from_pretrained(encoder(), folder)  # the bug: is_trainable=False
    model.base_model.model.classifier.requires_grad_(True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return loop(model, opt, steps, attach, named(model, "mix.lora_A"))


def moved(t: Trace) -> float:
    return max(t["watch"]) - min(t["watch"])


PEFT = "base_model.model."

# fmt: off
BROKEN = (
    Scenario("hb_peft_reentrant_checkpoint", "finetune",
             "peft: reentrant checkpointing after a frozen layer, no input grads",
             peft_checkpointing_without_input_grads, 300, 80, ("adapters_not_learning",),
             PEFT + "mix.lora_B.default.weight",
             source="locuslab/open-unlearning#178; huggingface/transformers#26221",
             signal="mix's adapters in the optimizer get no gradient; lora_B stays exactly 0",
             check=lambda t: need(max(t["watch"]) == 0.0, "lora_B moved")),
    Scenario("hb_peft_all_requires_grad", "finetune",
             "peft: every parameter set requires_grad=True after get_peft_model",
             peft_everything_unfrozen, 300, 80, ("base_not_frozen",),
             PEFT + "mix.base_layer.weight",
             source="peft print_trainable_parameters; full fine-tuning code pasted after the wrap",
             signal="base weights require grad, are stepped and move beside the adapters",
             check=lambda t: need(t["base_moved"][0] > 1e-3, "the base did not move")),
    Scenario("hb_hand_lora_group_lr_1e-9", "finetune",
             "hand LoRA, adapters' param group lr 1e-9 (1e-4 meant)", hand_lora_group_lr,
             300, 80, ("adapter_lr_too_small", "adapters_not_learning"), "proj_out.lora_B",
             source="huggingface/peft#793 (adapters that do not move), param-group form",
             signal="adapters with gradients; lora_B within 1e-7 of 0",
             check=lambda t: need(max(t["watch"]) < 1e-6, "lora_B moved")),
    Scenario("hb_peft_from_pretrained_frozen", "finetune",
             "PeftModel.from_pretrained without is_trainable=True, a new head trained",
             peft_loaded_not_trainable, 300, 80, ("adapters_not_trained",),
             PEFT + "mix.lora_A.default.weight",
             source="huggingface/peft#282; huggingface/trl#6700",
             signal="lora_A/lora_B require no grad and never change",
             check=lambda t: need(moved(t) == 0.0, "the adapter moved")),
)
# fmt: on
