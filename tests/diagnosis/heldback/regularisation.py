"""Held back. Regularisation, another optimizer and model."""

from __future__ import annotations

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, SmallCNN
from tests.diagnosis.corpus._common import Trace, need
from torch import nn


def adamw_weight_decay_10(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons", #22 (reduce regularisation) and the AdamW paper's decoupled
    # decay (Loshchilov & Hutter): weight_decay=1e2 where 1e-2 was meant (a sign lost in a
    # config), lr 1e-3: each step multiplies every weight by 0.9, and Adam's steps of ~lr
    # can hold them only near lr / (lr * wd) = 0.01.
    # Signal: the conv and head weight norms shrink steadily, by ~10% a step at first, to a
    # small fraction of their start; the loss goes back towards chance.
    model = SmallCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=100.0)
    task, t = Patterns(shape=(1, 8, 8), noise=0.8, seed=81), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, head=model.head.weight.norm(), conv=model.conv2.weight.norm())
        mon.log(loss=loss)
    return t


# fmt: off
BROKEN = (
    Scenario("hb_adamw_wd_1e2_cnn", "regularisation", "AdamW weight_decay=1e2 (1e-2 meant), CNN",
             adamw_weight_decay_10, 300, 120, ("weight_decay_too_high",),
             source="blog.slavv.com 37 Reasons #22; Loshchilov & Hutter, decoupled weight decay",
             signal="weight norms shrink ~10% a step, to <10% of their start",
             check=lambda t: need(t["head"][-1] < 0.1 * t["head"][0], "the head did not shrink")),
)
# fmt: on
