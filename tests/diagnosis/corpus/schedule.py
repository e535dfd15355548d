"""Learning rate and schedule misuse: an epoch schedule stepped per batch, an lr near 0, an
lr far too high."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, SmallCNN, Teacher, mlp
from tests.diagnosis.corpus._common import Trace, need, stalls
from torch import nn


def steplr_per_batch(steps: int, attach: Attach) -> Trace:
    # Source: "scheduler.step() inside the batch loop" (runebook.dev, LRScheduler.step
    # pitfalls; PyTorch forum "StepLR: learning rate becomes 0"): StepLR(step_size=10,
    # gamma=0.1) meant as "every 10 epochs", stepped after every batch.
    # Signal: the lr falls 10x every 10 steps, 0.1 -> 1e-16 by step 150; the loss freezes.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.1)
    task, t = Teacher(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()  # the bug: an epoch schedule stepped every batch
        t.rec(loss=loss, lr=opt.param_groups[0]["lr"])
        mon.log(loss=loss)
    return t


def check_lr_vanished(t: Trace) -> str:
    return need(t["lr"][-1] < 1e-9 * t["lr"][0], f"lr only fell to {t['lr'][-1]:.3g}")


def halving_per_batch_cnn(steps: int, attach: Attach) -> Trace:
    # Source: same pitfall, Adam and a CNN: StepLR(step_size=5, gamma=0.5) written for
    # epochs, stepped per batch (PyTorch forum, "Learning rate decreasing too fast").
    # Signal: the lr halves every 5 steps: 1e-3 -> 1e-21 by step 300, the loss stops moving
    # long before it has learned.
    model = SmallCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    task, t = Patterns(shape=(1, 8, 8), noise=1.0), Trace()
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


def linear_decay_one_epoch(steps: int, attach: Attach) -> Trace:
    # Source: the transformers recipe ``get_linear_schedule_with_warmup(opt, warmup,
    # num_training_steps)`` with num_training_steps = len(train_loader), one epoch, where
    # len(train_loader) * epochs was meant (huggingface/transformers issues and forum threads
    # "learning rate goes to 0 after the first epoch"); written out as its LambdaLR here.
    # Signal: the lr reaches exactly 0 at step 60 of the run and stays there; the loss stops
    # improving from then on.
    steps_per_epoch = 60
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def factor(step: int) -> float:
        if step < 6:
            return (step + 1) / 6
        return max(0.0, (steps_per_epoch - step) / (steps_per_epoch - 6))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)  # the bug: one epoch's steps
    task, t = Teacher(seed=3), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        t.rec(loss=loss, lr=opt.param_groups[0]["lr"])
        mon.log(loss=loss)
    return t


def sgd_lr_tiny_cnn(steps: int, attach: Attach) -> Trace:
    # Source: Slav Ivanov, "37 Reasons why your Neural Network is not working" (blog.slavv.com),
    # 33. "Too low learning rate": lr=1e-7 typed for 1e-2.
    # Signal: ||dw||/||w|| ~ 1e-7 a step; the loss stays where it started.
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=1e-7, momentum=0.9)
    task, t = Patterns(shape=(1, 8, 8)), Trace()
    attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)  # this user does not call mon.log
    return t


def sgd_lr_too_high_classifier(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons", 34. "Too high learning rate"; Karpathy's recipe ("the loss
    # explodes"): SGD lr=5 on a classifier.
    # Signal: updates of the order of the weights themselves; the loss jumps far above its
    # start (or to NaN) within a few steps.
    model = mlp(width=16, out=4)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    task, t = Patterns(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def check_blew_up(t: Trace) -> str:
    worst = max((v if math.isfinite(v) else math.inf) for v in t["loss"])
    return need(worst > 3 * t["loss"][0], f"the loss never rose above 3x its start ({worst:.3g})")


# fmt: off
BROKEN = (
    Scenario("steplr_stepped_per_batch", "schedule",
             "StepLR(step_size=10, gamma=0.1) for epochs, stepped every batch", steplr_per_batch,
             300, 200, ("lr_schedule_too_fast",),
             source="runebook.dev LRScheduler.step pitfalls; PyTorch forum: lr becomes 0",
             signal="lr 0.1 -> 1e-16 by step 150 while the loss freezes",
             check=check_lr_vanished),
    Scenario("halving_per_batch_cnn", "schedule",
             "StepLR(5, 0.5) for epochs, stepped every batch (CNN, Adam)", halving_per_batch_cnn,
             300, 250, ("lr_schedule_too_fast",),
             source="PyTorch forum: learning rate decreasing too fast",
             signal="lr halves every 5 steps, 1e-3 -> 1e-18", check=check_lr_vanished),
    Scenario("linear_decay_ends_epoch_1", "schedule",
             "linear decay to 0 over one epoch's steps (epochs forgotten), AdamW",
             linear_decay_one_epoch, 300, 200, ("lr_schedule_too_fast", "lr_zero"),
             source="transformers get_linear_schedule_with_warmup with len(loader) steps",
             signal="lr exactly 0 from step 60 on",
             check=lambda t: need(t["lr"][-1] == 0.0 and t["lr"][59] == 0.0, "lr not 0")),
    Scenario("sgd_lr_1e-7_cnn", "schedule", "SGD lr=1e-7 on a CNN", sgd_lr_tiny_cnn, 300, 120,
             ("lr_too_low", "update_ratio_low"),
             source="blog.slavv.com 37 Reasons why your Neural Network is not working, #33",
             signal="||dw||/||w|| ~ 1e-7 a step, the loss does not move", check=stalls(0.95)),
    Scenario("sgd_lr_5_classifier", "schedule", "SGD lr=5 on an MLP classifier",
             sgd_lr_too_high_classifier, 200, 60, ("lr_too_high", "update_ratio_high"),
             source="blog.slavv.com 37 Reasons, #34 too high learning rate; Karpathy's recipe",
             signal="updates as large as the weights; loss 3-5x its start, then dead ReLUs",
             check=check_blew_up),
)
# fmt: on
