"""Regularisation: a weight decay that collapses the weights."""

from __future__ import annotations

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Teacher, mlp
from tests.diagnosis.corpus._common import Trace, need, param_norm
from torch import nn


def weight_decay_collapse(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons why your Neural Network is not working", #22 "Reduce
    # regularization" (too much weight decay underfits); the fast.ai forum thread "Why apply
    # weight decay?": weight_decay=0.5 where 5e-4 was meant, with SGD lr 0.1.
    # Signal: every layer's weight norm shrinks steadily by ~(1 - lr * wd) a step to a
    # fraction of its start; the loss climbs back to the variance of the targets.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.5)
    task, t = Teacher(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, norm=param_norm(model))
        mon.log(loss=loss)
    return t


def check_collapse(t: Trace) -> str:
    return need(
        t["norm"][-1] < 0.1 * t["norm"][0],
        f"weights only shrank {t['norm'][0]:.3g} -> {t['norm'][-1]:.3g}",
    )


# fmt: off
BROKEN = (
    Scenario("sgd_weight_decay_05", "regularisation", "SGD weight_decay=0.5 (5e-4 meant)",
             weight_decay_collapse, 300, 150, ("weight_decay_too_high",),
             source="blog.slavv.com 37 Reasons #22; forums.fast.ai/t/why-apply-weight-decay/8557",
             signal="every weight norm shrinks steadily, to <10% of its start",
             check=check_collapse),
)
# fmt: on
