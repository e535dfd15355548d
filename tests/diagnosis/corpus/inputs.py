"""Inputs and labels: features on a scale of hundreds or thousands, labels that do not match
their inputs."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, SmallCNN
from tests.diagnosis.corpus._common import Trace, need
from torch import nn


def raw_pixels(steps: int, attach: Attach) -> Trace:
    # Source: Karpathy's recipe ("become one with the data"; preprocessing) and "37 Reasons",
    # #10 "Standardize the features": uint8 images cast to float without /255 or normalising.
    # Signal: the first conv sees inputs of mean ~128 and max 255; its gradient dwarfs the
    # others' and the loss lurches (Adam hides part of it).
    g = torch.Generator().manual_seed(3)
    templates = torch.randint(0, 256, (4, 1, 8, 8), generator=g).float()
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    t = Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        y = torch.randint(0, 4, (32,), generator=g)
        noisy = templates[y] + 40 * torch.randn(32, 1, 8, 8, generator=g)
        x = noisy.clamp(0, 255).to(torch.uint8).float()  # the bug: no / 255, no normalise
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, x_mean=x.mean())
        mon.log(loss=loss)
    return t


def check_raw_pixels(t: Trace) -> str:
    worst = max((v if math.isfinite(v) else math.inf) for v in t["loss"])
    return need(
        t.first("x_mean") > 50 and worst > 3 * t["loss"][0],
        f"inputs mean {t.first('x_mean'):.3g}, worst loss {worst:.3g}: no instability",
    )


def features_in_thousands(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons", #10 "Standardize the features" (tabular data: incomes, areas in
    # m^2, counts): raw features of scale 1e3 into an MLP trained with Adam.
    # Signal: the first layer's input has |x| ~ 1e3; pre-activations in the thousands, most
    # ReLUs saturate one way; the loss stays far above what the same data standardised reaches.
    g = torch.Generator().manual_seed(4)
    scale = torch.logspace(1, 3, 16)  # columns from 10 to 1,000
    w = torch.randn(16, 1, generator=g)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    t = Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        z = torch.randn(64, 16, generator=g)
        y = torch.tanh(z @ w / 4)
        x = 5 * scale + z * scale  # the bug: raw columns, never standardised
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, x_abs=x.abs().mean())
        mon.log(loss=loss)
    return t


def check_thousands(t: Trace) -> str:
    return need(
        t.first("x_abs") > 200 and t.last("loss") > 0.05,
        f"inputs |x| {t.first('x_abs'):.3g}, final loss {t.last('loss'):.3g}",
    )


def labels_from_previous_batch(steps: int, attach: Attach) -> Trace:
    # Source: Karpathy's recipe ("you mixed up the labels"; "verify the input to the net just
    # before it goes in") and "37 Reasons", #3 "inputs and labels not matching": a hand-
    # written loader yields each batch's inputs with the previous batch's labels.
    # Signal: the loss stays at the chance level log(4) = 1.39 while gradients flow normally.
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(), Trace()
    mon = attach(model, opt, total_steps=steps)
    _, previous = task.batch()
    for _ in range(steps):
        x, y = task.batch()
        y, previous = previous, y  # the bug: off by one batch
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def check_chance(t: Trace) -> str:
    return need(t.last("loss", 50) > 0.9 * math.log(4), f"loss {t.last('loss'):.3g} < chance")


# fmt: off
BROKEN = (
    Scenario("raw_pixels_0_255", "inputs", "uint8 images as float 0..255 into a CNN (SGD)",
             raw_pixels, 300, 120, ("inputs_not_normalised",), "conv1.weight",
             source="karpathy.github.io/2019/04/25/recipe/; blog.slavv.com 37 Reasons #10",
             signal="first-layer inputs of mean ~128, max 255; the loss lurches",
             check=check_raw_pixels),
    Scenario("tabular_features_1e3", "inputs", "raw tabular columns of scale 1e1..1e3 (Adam)",
             features_in_thousands, 300, 150, ("inputs_not_normalised",), "0.weight",
             source="blog.slavv.com 37 Reasons #10 standardize the features",
             signal="first-layer inputs |x| ~ 1e3", check=check_thousands),
    Scenario("labels_off_by_one_batch", "inputs", "each batch with the previous batch's labels",
             labels_from_previous_batch, 400, 300, ("labels_not_matching",),
             source="karpathy.github.io/2019/04/25/recipe/; blog.slavv.com 37 Reasons #3",
             signal="the loss stays at log(4) = 1.39 while gradients flow",
             check=check_chance),
)
# fmt: on
