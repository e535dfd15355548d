"""Optimizer misuse: zero_grad forgotten or misplaced, step before backward, parameters in
no group."""

from __future__ import annotations

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, Teacher, mlp
from tests.diagnosis.corpus._common import Trace, grad_norm, need, stalls
from torch import nn


def zero_grad_never(steps: int, attach: Attach) -> Trace:
    # Source: Karpathy, "A Recipe for Training Neural Networks" (karpathy.github.io/2019/04/25/
    # recipe/) lists "you forgot to zero_grad() before backward()" among the most common
    # mistakes; discuss.pytorch.org/t/what-does-the-backward-function-do/9944 ("call this
    # before loss.backward(), otherwise you'll accumulate the gradients").
    # Signal: the gradient norm grows linearly with the step (each backward adds to .grad);
    # the loss first falls, then oscillates and climbs back.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    task, t = Teacher(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # the bug: no optimizer.zero_grad() anywhere in the loop
        t.rec(grad=grad_norm(model.parameters()), loss=loss)
        opt.step()
        mon.log(loss=loss)
    return t


def check_zero_grad_never(t: Trace) -> str:
    return need(
        t.last("grad", 10) > 10 * t.first("grad", 5),
        f"grad norm did not grow with the step: {t.first('grad'):.3g} -> {t.last('grad'):.3g}",
    )


def zero_grad_between(steps: int, attach: Attach) -> Trace:
    # Source: discuss.pytorch.org/t/what-step-backward-and-zero-grad-do/33301 ("hopefully you
    # use them in the other order: zero_grad, backward, step"): anywhere but between
    # loss.backward() and optimizer.step().
    # Signal: every gradient is reset (to None) right before the step; no parameter ever
    # changes and the loss stays at its starting (chance) level, log(4) = 1.39.
    model = mlp(width=16, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.zero_grad()  # the bug: clears what backward just computed
        opt.step()
        t.rec(loss=loss, w=model[0].weight.norm())
        mon.log(loss=loss)
    return t


def check_unchanged(t: Trace) -> str:
    return need(
        max(t["w"]) - min(t["w"]) < 1e-6 and stalls(0.9)(t) == "",
        f"the weights moved ({min(t['w']):.6g}..{max(t['w']):.6g}) or the loss fell",
    )


def step_before_backward(steps: int, attach: Attach) -> Trace:
    # Source: discuss.pytorch.org/t/what-step-backward-and-zero-grad-do/33301 (the three calls
    # and their order): here in the wrong order, with zero_grad() first as in the tutorials,
    # so that each step sees no gradient.
    # Signal: the optimizer steps before backward in each iteration; the gradients it finds
    # were just cleared: the weights never change and the loss stays where it started.
    model = mlp(width=16, out=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    task, t = Patterns(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        opt.zero_grad()
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.step()  # the bug: the step comes before the backward that fills .grad
        loss.backward()
        t.rec(loss=loss, w=model[0].weight.norm())
        mon.log(loss=loss)
    return t


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def head_replaced_after_optimizer(steps: int, attach: Attach) -> Trace:
    # Source: the transfer-learning recipe (PyTorch's tutorial, as in pgg1610.github.io's
    # "Transfer learning walkthrough using Pytorch": ``model.fc = nn.Linear(...)``, then the
    # optimizer) with the two lines in the other order: the optimizer is built, then
    # ``model.fc`` is replaced for the new number of classes; the new head is in no group.
    # Signal: fc.weight has a gradient every step and never changes; the loss falls only as
    # far as the features can take it with a random head.
    model = Backbone()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.fc = nn.Linear(32, 4)  # the bug: a new head after the optimizer was built
    task, t = Patterns(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, head=model.fc.weight.norm(), head_grad=model.fc.weight.grad.norm())
        mon.log(loss=loss)
    return t


def check_head_frozen(t: Trace) -> str:
    return need(
        max(t["head"]) - min(t["head"]) < 1e-6 and min(t["head_grad"]) > 0,
        "the head moved, or had no gradient",
    )


# fmt: off
BROKEN = (
    Scenario("zg_never_mlp_sgd", "optimizer", "optimizer.zero_grad() never called (MLP, SGD)",
             zero_grad_never, 300, 200, ("zero_grad_missing",),
             source="karpathy.github.io/2019/04/25/recipe/; discuss.pytorch.org/t/9944",
             signal="grad norm grows linearly with the step", check=check_zero_grad_never),
    Scenario("zg_between_backward_step", "optimizer",
             "zero_grad() between backward() and step() (MLP classifier, Adam)",
             zero_grad_between, 300, 120, ("zero_grad_after_backward",),
             source="discuss.pytorch.org/t/what-step-backward-and-zero-grad-do/33301",
             signal="grads cleared right before every step: weights never move, loss at chance",
             check=check_unchanged),
    Scenario("step_then_backward_sgd", "optimizer",
             "zero_grad(); forward; step(); backward() (SGD momentum)", step_before_backward,
             300, 120, ("step_before_backward",),
             source="discuss.pytorch.org/t/what-step-backward-and-zero-grad-do/33301 (order)",
             signal="each step finds the gradients just cleared: weights never move",
             check=check_unchanged),
    Scenario("head_swapped_after_opt", "optimizer",
             "model.fc replaced after the optimizer was built", head_replaced_after_optimizer,
             300, 60, ("params_not_in_optimizer",), "fc.weight",
             source="PyTorch transfer-learning tutorial (pgg1610.github.io), lines swapped",
             signal="fc.weight has a gradient every step and never changes",
             check=check_head_frozen),
)
# fmt: on
