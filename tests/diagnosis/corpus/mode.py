"""Normalisation and mode: eval() left on while training, BatchNorm on two samples, dropout
far too high."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns
from tests.diagnosis.corpus._common import Check, Trace, need
from torch import nn


def above(level: float) -> Check:
    """The loss stays above ``level`` (its last 50 steps), where a healthy run goes far below."""

    def check(t: Trace) -> str:
        return need(t.last("loss", 50) > level, f"the loss went to {t.last('loss', 50):.3g}")

    return check


def mlp_bn_dropout(p: float = 0.3) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, 4)
    )


def evaluate(model: nn.Module, task: Patterns) -> float:
    model.eval()
    with torch.no_grad():
        x, y = task.batch(128)
        return float(nn.functional.cross_entropy(model(x), y))


def eval_left_on(steps: int, attach: Attach) -> Trace:
    # Source: github.com/pytorch/tutorials/issues/1624 and PR 1602 (the quickstart's test()
    # calls model.eval() and train() never calls model.train(): every epoch after the first
    # trains in eval mode); here a baseline evaluation before the first epoch, so BatchNorm
    # keeps its initial running statistics and Dropout is off for the whole run.
    # Signal: every module with dropout/BatchNorm has training=False at each optimizer step;
    # BatchNorm's running_mean never moves from 0.
    model = mlp_bn_dropout()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(), Trace()
    mon = attach(model, opt, total_steps=steps)
    evaluate(model, task)  # a baseline before training; the bug: no model.train() after it
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, training=float(model.training), bn_mean=model[1].running_mean.abs().sum())
        mon.log(loss=loss)
    return t


def check_eval(t: Trace) -> str:
    return need(max(t["training"]) == 0 and max(t["bn_mean"]) == 0, "the model trained in train()")


def batchnorm_two_samples(steps: int, attach: Attach) -> Trace:
    # Source: github.com/pytorch/pytorch/issues/4534 ("BatchNorm1d fails with batch size 1")
    # and its answers: batch 1 raises, so users pick 2 (a big input, little memory); the
    # statistics of two samples make every feature +-1 after the BatchNorm.
    # Signal: BatchNorm1d in training mode sees 2 samples a step; the loss is noisy and stays
    # above 0.2 (batch 32: below 0.05).
    model = mlp_bn_dropout(p=0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    task, t = Patterns(noise=0.6), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(2)  # the bug: a batch of two through BatchNorm1d
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def dropout_099(steps: int, attach: Attach) -> Trace:
    # Source: Keras/PyTorch confusion over the argument (Keras' rate is the fraction dropped,
    # some code passes the keep probability): nn.Dropout(p=0.99) meant as "keep 99%"
    # ("37 Reasons", #22 "too much regularisation").
    # Signal: 99% of the hidden units are zero in every training forward; the loss stays above
    # chance, log(4).
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(p=0.99), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
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


# fmt: off
BROKEN = (
    Scenario("eval_never_switched_back", "mode",
             "model.eval() for a baseline, model.train() never called (BN + dropout)",
             eval_left_on, 300, 60, ("eval_mode_during_training",),
             source="github.com/pytorch/tutorials/issues/1624 (and PR 1602)",
             signal="training=False on BatchNorm/Dropout at every optimizer step",
             check=check_eval),
    Scenario("bn1d_batch_of_two", "mode", "BatchNorm1d fed 2 samples a step",
             batchnorm_two_samples, 300, 150, ("batchnorm_tiny_batch",), "1",
             source="github.com/pytorch/pytorch/issues/4534 (BatchNorm1d and batch size 1)",
             signal="2 samples a step at a BatchNorm in training mode; loss noisy and high",
             check=above(0.2)),
    Scenario("dropout_p_099", "mode", "nn.Dropout(p=0.99) meant as keep 0.99",
             dropout_099, 300, 150, ("dropout_too_high",), "2",
             source="blog.slavv.com 37 Reasons #22; Keras rate vs keep_prob confusion",
             signal="99% of the hidden units zeroed each forward; loss near chance",
             check=above(0.9 * math.log(4))),
)
# fmt: on
