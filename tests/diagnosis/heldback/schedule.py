"""Held back. Schedule misuse and lr far off, other models and settings."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, SmallCNN, TinyTransformer, reverse_batch
from tests.diagnosis.corpus._common import GRUClassifier, Trace, need, stalls
from torch import nn


def exponential_per_batch(steps: int, attach: Attach) -> Trace:
    # Source: runebook.dev LRScheduler.step pitfalls ("ExponentialLR ... call once per epoch")
    # and the PyTorch forum "ExponentialLR makes the lr zero": gamma=0.9 meant per epoch,
    # stepped every batch.
    # Signal: the lr falls 10x every 22 steps: 3e-3 -> ~1e-17 by step 300; the loss freezes.
    model = GRUClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    task, t = Patterns(shape=(6, 8), noise=1.2, seed=31), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()  # the bug
        t.rec(loss=loss, lr=opt.param_groups[0]["lr"])
        mon.log(loss=loss)
    return t


def polynomial_decay_wrong_total(steps: int, attach: Attach) -> Trace:
    # Source: PyTorch's PolynomialLR (total_iters) and the transformers scheduler threads
    # ("lr is 0 after epoch 1"): total_iters set to the batches of one epoch (40) while
    # the schedule is stepped every batch for the whole run; SGD on a CNN.
    # Signal: the lr reaches exactly 0 at step 40 and stays 0 for the rest of the run.
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=40, power=2.0)
    task, t = Patterns(shape=(1, 8, 8), noise=1.2, seed=34), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        t.rec(loss=loss, lr=opt.param_groups[0]["lr"])
        mon.log(loss=loss)
    return t


def warmup_typo(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons", #33 (too low learning rate) in its schedule form: a linear warm-up
    # over 100,000 steps where 1,000 was meant (an extra zero in a config), AdamW 1e-3.
    # Signal: the lr stays between 1e-8 and 3e-6 for the whole run; updates ~1e-6 of the
    # weights; the loss does not move.
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 100_000))
    g, t = torch.Generator().manual_seed(32), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = reverse_batch(g)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        t.rec(loss=loss, lr=opt.param_groups[0]["lr"])
        mon.log(loss=loss)
    return t


def transformer_adamw_lr_half(steps: int, attach: Attach) -> Trace:
    # Source: Karpathy's recipe (the lr "3e-4 is the best learning rate for Adam") and "37
    # Reasons", #34: AdamW lr=0.5 on a transformer.
    # Signal: every step moves each weight by ~0.5, a large part of the weights' own size; the loss
    # stays at chance, log(8).
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    g, t = torch.Generator().manual_seed(33), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = reverse_batch(g)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, ratio=opt.param_groups[0]["lr"] / model.head.weight.abs().mean())
        mon.log(loss=loss)
    return t


def check_at_chance(t: Trace) -> str:
    # An Adam step moves each weight by ~lr: here over a fifth of the head's mean |w| (a
    # healthy step: ~1e-3 of it).
    return need(
        t.last("loss") > 0.9 * math.log(8) and min(t["ratio"]) > 0.2,
        f"loss {t.last('loss'):.3g} (chance {math.log(8):.3g}), lr/|w| {min(t['ratio']):.3g}",
    )


# fmt: off
BROKEN = (
    Scenario("hb_exponentiallr_per_batch", "schedule",
             "ExponentialLR(gamma=0.9) for epochs, stepped every batch (GRU, Adam)",
             exponential_per_batch, 300, 250, ("lr_schedule_too_fast",),
             source="runebook.dev LRScheduler.step pitfalls; forum: ExponentialLR makes lr zero",
             signal="lr 3e-3 -> 1e-14 within the run",
             check=lambda t: need(t["lr"][-1] < 1e-9 * t["lr"][0], "the lr did not vanish")),
    Scenario("hb_polynomiallr_one_epoch", "schedule",
             "PolynomialLR(total_iters=one epoch) stepped per batch for the run (CNN, SGD)",
             polynomial_decay_wrong_total, 300, 200, ("lr_schedule_too_fast", "lr_zero"),
             source="PyTorch PolynomialLR docs; forum: lr is 0 after the first epoch",
             signal="lr exactly 0 from step 40 on",
             check=lambda t: need(t["lr"][-1] == 0.0 and t["lr"][40] == 0.0, "lr not 0")),
    Scenario("hb_warmup_100k_typo", "schedule", "linear warm-up over 100,000 steps (1,000 meant)",
             warmup_typo, 300, 120, ("lr_too_low", "update_ratio_low"),
             source="blog.slavv.com 37 Reasons #33 (too low learning rate)",
             signal="lr below 3e-6 the whole run; the loss does not move", check=stalls(0.95)),
    Scenario("hb_transformer_adamw_lr_05", "schedule", "AdamW lr=0.5 on a transformer",
             transformer_adamw_lr_half, 200, 60, ("lr_too_high", "update_ratio_high"),
             source="karpathy.github.io/2019/04/25/recipe/; blog.slavv.com 37 Reasons #34",
             signal="each step moves weights by >20% of their size; the loss stays at chance",
             check=check_at_chance),
)
# fmt: on
