"""Held back. Normalisation and mode, other models and settings."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns
from tests.diagnosis.corpus._common import BNConvNet, Trace, need
from torch import nn


def cnn_bn_eval_left(steps: int, attach: Attach) -> Trace:
    # Source: github.com/wkentaro/pytorch-fcn/issues/57 (model.train() not called again after
    # validate()) and github.com/tk-rusch/coRNN/issues/1: a helper ``accuracy(model, loader)``
    # calls model.eval() and is run once before training; BatchNorm uses its initial running
    # statistics (0 and 1) for the whole run.
    # Signal: the BatchNorm2d layers have training=False at every optimizer step;
    # running_mean stays 0.
    model = BNConvNet(bias=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(shape=(1, 8, 8), noise=0.8, seed=61), Trace()
    mon = attach(model, opt, total_steps=steps)
    model.eval()  # inside an accuracy() helper, before the first epoch; never undone
    with torch.no_grad():
        x, _ = task.batch(64)
        model(x)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, training=float(model.bn1.training), rm=model.bn1.running_mean.abs().sum())
        mon.log(loss=loss)
    return t


class GRUBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(8, 32, batch_first=True)
        self.norm = nn.BatchNorm1d(32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(torch.relu(self.norm(out[:, -1])))


def gru_bn_batch_two(steps: int, attach: Attach) -> Trace:
    # Source: github.com/pytorch/pytorch/issues/4534 and the "Expected more than 1 value per
    # channel when training" issues: long sequences, memory for two a step, a BatchNorm1d
    # after the GRU.
    # Signal: BatchNorm1d in training mode sees 2 samples a step; every feature it outputs is
    # +-1; the loss stays noisy and high.
    model = GRUBatchNorm()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(shape=(6, 8), noise=1.0, seed=62), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(2)  # the bug
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


class DropoutCNN(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.drop = nn.Dropout(p)
        self.fc = nn.Linear(16 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(self.drop(x.flatten(1)))


def cnn_dropout_095(steps: int, attach: Attach) -> Trace:
    # Source: TensorFlow 1's keep_prob vs PyTorch's p (the probability to drop): a port keeps
    # "0.95", now dropping 95% of the features ("37 Reasons", #22 too much regularisation).
    # Signal: 95% of the features before the head are zero in every training forward; the
    # loss stays far above what the same model reaches without it.
    model = DropoutCNN(p=0.95)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(shape=(1, 8, 8), noise=1.5, seed=63), Trace()
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
    Scenario("hb_cnn_bn_left_in_eval", "mode",
             "model.eval() in an accuracy() helper before training, never undone (CNN + BN)",
             cnn_bn_eval_left, 300, 60, ("eval_mode_during_training",),
             source="github.com/wkentaro/pytorch-fcn/issues/57; tk-rusch/coRNN#1",
             signal="BatchNorm2d training=False at every step; running_mean stays 0",
             check=lambda t: need(max(t["training"]) == 0 and max(t["rm"]) == 0, "trained")),
    Scenario("hb_gru_bn1d_batch_2", "mode", "GRU -> BatchNorm1d, 2 sequences a step",
             gru_bn_batch_two, 300, 150, ("batchnorm_tiny_batch",), "norm",
             source="github.com/pytorch/pytorch/issues/4534; 'Expected more than 1 value' issues",
             signal="2 samples a step at BatchNorm1d in training mode",
             check=lambda t: need(t.last("loss", 50) > 0.3, "the loss went low")),
    Scenario("hb_cnn_dropout_095", "mode", "Dropout(p=0.95) before the head (keep_prob port)",
             cnn_dropout_095, 300, 150, ("dropout_too_high",), "drop",
             source="TF keep_prob vs torch p; blog.slavv.com 37 Reasons #22",
             signal="95% of the head's inputs zeroed each forward",
             check=lambda t: need(t.last("loss", 50) > 0.5 * math.log(4), "the loss went low")),
)
# fmt: on
