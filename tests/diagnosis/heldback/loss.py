"""Held back. Loss misuse, other models and settings."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns
from tests.diagnosis.corpus._common import Trace, need
from torch import nn


class GRUSoftmax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(8, 16, batch_first=True)
        self.head = nn.Linear(16, 5)
        self.softmax = nn.Softmax(dim=-1)  # the bug, with the loss below

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.softmax(self.head(out[:, -1]))


def gru_softmax_log_softmax_nll(steps: int, attach: Attach) -> Trace:
    # Source: runebook.dev "Understanding PyTorch's torch.nn.Softmax and CrossEntropyLoss" and
    # the forum's "Softmax + NLLLoss": the model ends in nn.Softmax; the loop then applies
    # log_softmax because "NLLLoss needs log-probabilities": log_softmax of probabilities.
    # Signal: a softmax node feeds log_softmax -> nll_loss; the loss floors at
    # log(1 + 4/e) = 0.90 for 5 classes.
    model = GRUSoftmax()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    task, t = Patterns(classes=5, shape=(6, 8), noise=0.5, seed=41), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.nll_loss(nn.functional.log_softmax(model(x), dim=-1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


class MultiLabelCNN(nn.Module):
    def __init__(self, labels: int = 6) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return torch.sigmoid(self.fc(x.flatten(1)))  # the bug, with BCEWithLogitsLoss


def multilabel_sigmoid_bce_logits(steps: int, attach: Attach) -> Trace:
    # Source: runebook.dev "A Guide to Sigmoid, Softmax, and BCEWithLogitsLoss in PyTorch"
    # (nn.BCEWithLogitsLoss's docs: it "combines a Sigmoid layer and the BCELoss"): a
    # multi-label CNN whose forward ends in torch.sigmoid.
    # Signal: a sigmoid feeds the loss's own sigmoid; the loss floors at 0.313.
    g = torch.Generator().manual_seed(42)
    protos = torch.randn(6, 1, 8, 8, generator=g)
    model = MultiLabelCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    t = Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        y = (torch.rand(32, 6, generator=g) < 0.4).float()
        x = torch.einsum("bl,lchw->bchw", y, protos) + 0.3 * torch.randn(32, 1, 8, 8, generator=g)
        loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def ce_sum_reduction(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons", #27 (check the loss function) and forum threads on
    # ``reduction='sum'`` with SGD: CrossEntropyLoss(reduction="sum"), batch 128, an lr
    # picked for the mean.
    # Signal: the loss (a sum over 128 samples) and its gradient are 128x the mean's; the
    # updates are far too large and the loss jumps to many times its start.
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss(reduction="sum")
    task, t = Patterns(noise=0.6, seed=43), Trace()
    attach(model, opt, total_steps=steps)  # this user does not call mon.log
    for _ in range(steps):
        x, y = task.batch(128)
        loss = criterion(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
    return t


def check_sum_blows_up(t: Trace) -> str:
    worst = max((v if math.isfinite(v) else math.inf) for v in t["loss"][1:])
    return need(worst > 3 * t["loss"][0], f"the summed loss stayed below 3x its start: {worst:.3g}")


# fmt: off
BROKEN = (
    Scenario("hb_gru_softmax_logsoftmax_nll", "loss",
             "GRU ending in nn.Softmax, then log_softmax + nll_loss", gru_softmax_log_softmax_nll,
             300, 150, ("softmax_before_cross_entropy",),
             source="runebook.dev torch.nn.Softmax and CrossEntropyLoss; forum: Softmax+NLLLoss",
             signal="softmax feeds log_softmax -> nll_loss; loss floors at 0.90",
             check=lambda t: need(min(t["loss"]) > math.log(1 + 4 / math.e) - 0.02, "below floor")),
    Scenario("hb_multilabel_sigmoid_bcelogits", "loss",
             "multi-label CNN ending in torch.sigmoid, BCEWithLogitsLoss",
             multilabel_sigmoid_bce_logits, 300, 150, ("softmax_before_cross_entropy",),
             source="runebook.dev torch.nn.functional.sigmoid guide; BCEWithLogitsLoss docs",
             signal="sigmoid feeds the loss's sigmoid; loss floors at 0.313",
             check=lambda t: need(min(t["loss"]) > math.log(1 + math.exp(-1)) - 0.02, "floor")),
    Scenario("hb_ce_sum_batch128_sgd", "loss", "CrossEntropyLoss(reduction='sum'), batch 128, SGD",
             ce_sum_reduction, 200, 60, ("loss_sum_reduction",),
             source="blog.slavv.com 37 Reasons #27; forum: reduction='sum' explodes with SGD",
             signal="gradient 128x the mean's; the loss jumps to many times its start",
             check=check_sum_blows_up),
)
# fmt: on
