"""Held back. Optimizer misuse, other models and settings than the tuning part."""

from __future__ import annotations

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, SmallCNN, Teacher
from tests.diagnosis.corpus._common import GRUClassifier, Trace, grad_norm, need
from torch import nn


def cnn_adam_no_zero_grad(steps: int, attach: Attach) -> Trace:
    # Source: karpathy.github.io/2019/04/25/recipe/ (forgot to zero_grad) and
    # discuss.pytorch.org/t/what-does-the-backward-function-do/9944; here a CNN with Adam,
    # whose normalised step hides part of it: the loss still falls at first.
    # Signal: the gradient norm grows with the step, ~linearly (the sum of all past batches).
    model = SmallCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(shape=(1, 8, 8), noise=0.8, seed=21), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # the bug: .grad is never reset
        opt.step()
        t.rec(loss=loss, grad=grad_norm(model.parameters()))
        mon.log(loss=loss)
    return t


def check_grad_grows(t: Trace) -> str:
    return need(t.last("grad", 10) > 10 * t.first("grad", 5), "the grad norm did not grow")


def gru_model_zero_grad_between(steps: int, attach: Attach) -> Trace:
    # Source: velog.io/@rhss10 (where to put optimizer.zero_grad(): anywhere but between
    # backward() and step()) and discuss.pytorch.org/t/what-step-backward-and-zero-grad-do/
    # 33301: model.zero_grad() placed after backward(), before step().
    # Signal: each step finds no gradient (set to None); the GRU's weights never change and
    # the loss stays at chance.
    model = GRUClassifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    task, t = Patterns(shape=(6, 8), noise=0.8, seed=22), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        model.zero_grad()  # the bug
        opt.step()
        t.rec(loss=loss, w=model.gru.weight_ih_l0.norm())
        mon.log(loss=loss)
    return t


def check_frozen(t: Trace) -> str:
    return need(max(t["w"]) - min(t["w"]) < 1e-6, "the weights moved")


def cnn_adam_step_before_backward(steps: int, attach: Attach) -> Trace:
    # Source: discuss.pytorch.org/t/what-step-backward-and-zero-grad-do/33301 (the calls'
    # order): forward, zero_grad(), step(), backward() (a loop reorganised around a logging
    # call). With the gradients just
    # reset to None, Adam skips every parameter.
    # Signal: within each iteration the optimizer steps before backward runs, on no
    # gradient; the weights never change; the loss stays at chance.
    model = SmallCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(shape=(1, 8, 8), seed=23), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        opt.step()  # the bug: before backward
        loss.backward()
        t.rec(loss=loss, w=model.conv1.weight.norm())
        mon.log(loss=loss)
    return t


def zero_grad_once_per_epoch(steps: int, attach: Attach) -> Trace:
    # Source: PyTorch forum, "zero_grad() outside the batch loop" (it sits under ``for epoch
    # in ...`` instead of the batch loop): the gradients are reset once an epoch of 50
    # batches and add up in between.
    # Signal: within each epoch the gradient norm grows several-fold with the step (the sum
    # of the epoch's batches so far), dropping back at each epoch's start; with a small lr
    # the loss still falls, which hides it.
    model = nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.002)
    task, t = Teacher(seed=25), Trace()
    mon = attach(model, opt, total_steps=steps)
    step = 0
    while step < steps:
        opt.zero_grad()  # the bug: once per epoch
        for _ in range(50):
            if step == steps:
                break
            x, y = task.batch()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            t.rec(loss=loss, grad=grad_norm(model.parameters()))
            opt.step()
            mon.log(loss=loss)
            step += 1
    return t


def check_grows_in_epoch(t: Trace) -> str:
    g = t["grad"]
    late = sum(g[40:50]) / 10
    early = sum(g[1:6]) / 5
    return need(late > 3 * early, f"grad norm in epoch 1: {early:.3g} -> {late:.3g}")


class BagOfEmbeddings(nn.Module):
    def __init__(self, vocab: int = 32, d: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.encoder = nn.Sequential(nn.Linear(d, 32), nn.ReLU())
        self.head = nn.Linear(32, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens).mean(1)))


def embedding_in_no_group(steps: int, attach: Attach) -> Trace:
    # Source: PyTorch docs, "per-parameter options" and forum threads "some parameters are
    # not updated with param groups": groups listed by hand for two learning rates, the
    # embedding forgotten.
    # Signal: embed.weight has a gradient every step, is in no param group, never changes.
    model = BagOfEmbeddings()
    opt = torch.optim.Adam(
        [
            {"params": model.encoder.parameters(), "lr": 1e-3},
            {"params": model.head.parameters(), "lr": 3e-3},
        ]  # the bug: no group for model.embed
    )
    g, t = torch.Generator().manual_seed(24), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        tokens = torch.randint(0, 32, (32, 6), generator=g)
        y = tokens[:, 0] % 4
        loss = nn.functional.cross_entropy(model(tokens), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, w=model.embed.weight.norm())
        mon.log(loss=loss)
    return t


# fmt: off
BROKEN = (
    Scenario("hb_cnn_adam_no_zero_grad", "optimizer", "zero_grad() never called (CNN, Adam)",
             cnn_adam_no_zero_grad, 300, 150, ("zero_grad_missing",),
             source="karpathy.github.io/2019/04/25/recipe/; discuss.pytorch.org/t/9944",
             signal="grad norm grows ~linearly with the step", check=check_grad_grows),
    Scenario("hb_gru_model_zero_grad_mid", "optimizer",
             "model.zero_grad() between backward() and step() (GRU, SGD)",
             gru_model_zero_grad_between, 300, 100, ("zero_grad_after_backward",),
             source="velog.io/@rhss10 (zero_grad placement); discuss.pytorch.org/t/33301",
             signal="no gradient at any step; the weights never change", check=check_frozen),
    Scenario("hb_cnn_adam_step_first", "optimizer",
             "forward; zero_grad(); step(); backward() (CNN, Adam)",
             cnn_adam_step_before_backward, 300, 100, ("step_before_backward",),
             source="discuss.pytorch.org/t/what-step-backward-and-zero-grad-do/33301 (order)",
             signal="each step runs before backward, on no gradient; weights never change",
             check=check_frozen),
    Scenario("hb_zero_grad_once_per_epoch", "optimizer",
             "optimizer.zero_grad() under the epoch loop, not the batch loop (MLP, SGD)",
             zero_grad_once_per_epoch, 300, 200, ("zero_grad_missing",),
             source="PyTorch forum: zero_grad() outside the batch loop",
             signal="grad norm grows several-fold within each epoch of 50, resets at its start",
             check=check_grows_in_epoch),
    Scenario("hb_embedding_group_forgotten", "optimizer",
             "param groups by hand, the embedding forgotten", embedding_in_no_group, 300, 60,
             ("params_not_in_optimizer",), "embed.weight",
             source="pytorch.org/docs/stable/optim.html per-parameter options; forum threads",
             signal="embed.weight has gradients and never changes",
             check=lambda t: need(max(t["w"]) - min(t["w"]) < 1e-6, "the embedding moved")),
)
# fmt: on
