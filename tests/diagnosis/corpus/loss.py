"""Loss misuse: probabilities where the loss expects logits, a summed loss."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, Teacher, mlp
from tests.diagnosis.corpus._common import Check, Trace, need
from torch import nn


def softmax_then_cross_entropy(steps: int, attach: Attach) -> Trace:
    # Source: PyTorch forum, "Cross Entropy loss is not decreasing"
    # (discuss.pytorch.org/t/cross-entropy-loss-is-not-decreasing/43814): the model ends in
    # nn.Softmax and its output goes to nn.CrossEntropyLoss, which applies log_softmax again.
    # Signal: a softmax node feeds the loss's log_softmax in the autograd graph; the loss
    # cannot go below log(1 + 3/e) = 0.74 for 4 classes, however well the model separates them.
    model = nn.Sequential(mlp(width=16, out=4), nn.Softmax(dim=1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = nn.CrossEntropyLoss()
    task, t = Patterns(), Trace()
    attach(model, opt, total_steps=steps)  # this user does not call mon.log
    for _ in range(steps):
        x, y = task.batch()
        loss = criterion(model(x), y)  # the bug: probabilities, not logits
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
    return t


def floor(value: float) -> Check:
    def check(t: Trace) -> str:
        return need(
            min(t["loss"]) > value - 0.02,
            f"the loss went below the floor {value:.3f}: {min(t['loss']):.3f}",
        )

    return check


def sigmoid_then_bce_with_logits(steps: int, attach: Attach) -> Trace:
    # Source: philkr.net/cs342/doc/sigmoid ("you don't need to pass the input tensor to the
    # sigmoid layer before training with BCEWithLogitsLoss") and nn.BCEWithLogitsLoss's docs
    # (it "combines a Sigmoid layer and the BCELoss").
    # Signal: a sigmoid node feeds the loss's own sigmoid; the loss cannot go below
    # log(1 + e^-1) = 0.313 even on separable data.
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = nn.BCEWithLogitsLoss()
    task, t = Patterns(classes=2), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = criterion(model(x).squeeze(1), y.float())  # the bug: sigmoid twice
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def sum_reduction_sgd(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons why your Neural Network is not working", #27 "Check the loss
    # function": nn.MSELoss(reduction="sum") with an lr tuned for the mean (PyTorch forum,
    # "size_average=False makes the loss explode"); batch 256.
    # Signal: the gradient is 256x the mean's; the loss climbs to NaN/Inf within a few steps.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.MSELoss(reduction="sum")
    task, t = Teacher(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(256)
        loss = criterion(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def check_diverged(t: Trace) -> str:
    worst = max((v if math.isfinite(v) else math.inf) for v in t["loss"])
    return need(worst > 100 * t["loss"][0], f"the loss stayed below 100x its start: {worst:.3g}")


# fmt: off
BROKEN = (
    Scenario("softmax_into_ce", "loss", "nn.Softmax output into nn.CrossEntropyLoss (Adam)",
             softmax_then_cross_entropy, 300, 150, ("softmax_before_cross_entropy",),
             source="discuss.pytorch.org/t/cross-entropy-loss-is-not-decreasing/43814",
             signal="softmax feeds log_softmax in the graph; the loss floors at 0.74",
             check=floor(math.log(1 + 3 / math.e))),
    Scenario("sigmoid_into_bcelogits", "loss", "nn.Sigmoid output into nn.BCEWithLogitsLoss",
             sigmoid_then_bce_with_logits, 300, 150, ("softmax_before_cross_entropy",),
             source="philkr.net/cs342/doc/sigmoid; torch.nn.BCEWithLogitsLoss docs",
             signal="sigmoid feeds the loss's sigmoid; the loss floors at 0.313",
             check=floor(math.log(1 + math.exp(-1)))),
    Scenario("mse_sum_reduction_sgd", "loss", "MSELoss(reduction='sum'), batch 256, SGD 0.05",
             sum_reduction_sgd, 200, 60, ("loss_sum_reduction",),
             source="blog.slavv.com 37 Reasons, #27; PyTorch forum: size_average=False explodes",
             signal="gradient 256x the mean's: the loss explodes within a few steps",
             check=check_diverged),
)
# fmt: on
