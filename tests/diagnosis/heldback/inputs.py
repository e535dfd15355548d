"""Held back. Inputs and labels, other models and settings."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import SmallCNN
from tests.diagnosis.corpus._common import GRUClassifier, Trace, need
from torch import nn


def gru_adc_counts(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons", #10 (standardize the features) and Karpathy's recipe: raw 12-bit
    # sensor readings (0..4095 ADC counts) into a GRU, never scaled.
    # Signal: the GRU's input has |x| ~ 2e3; its gates saturate at once; the loss falls far
    # slower than on the same data scaled to unit variance.
    g = torch.Generator().manual_seed(51)
    templates = torch.rand(4, 6, 8, generator=g) * 4095
    model = GRUClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    t = Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        y = torch.randint(0, 4, (32,), generator=g)
        x = (templates[y] + 600 * torch.randn(32, 6, 8, generator=g)).clamp(0, 4095)
        loss = nn.functional.cross_entropy(model(x), y)  # the bug: raw counts
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, x_abs=x.abs().mean())
        mon.log(loss=loss)
    return t


def two_separate_shuffles(steps: int, attach: Attach) -> Trace:
    # Source: Karpathy's recipe ("shuffled the labels by accident") and "37 Reasons", #3
    # ("inputs and labels not matching"): each epoch shuffles the images and the labels with
    # two separate permutations (np.random.shuffle called on each array).
    # Signal: the loss stays at log(4) = 1.39 (chance) while gradients flow.
    g = torch.Generator().manual_seed(52)
    templates = torch.randn(4, 1, 8, 8, generator=g)
    labels = torch.randint(0, 4, (2048,), generator=g)
    images = templates[labels] + 0.5 * torch.randn(2048, 1, 8, 8, generator=g)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    t = Trace()
    mon = attach(model, opt, total_steps=steps)
    step = 0
    while step < steps:
        xs = images[torch.randperm(2048, generator=g)]
        ys = labels[torch.randperm(2048, generator=g)]  # the bug: a second permutation
        for i in range(0, 2048, 32):
            if step == steps:
                break
            loss = nn.functional.cross_entropy(model(xs[i : i + 32]), ys[i : i + 32])
            opt.zero_grad()
            loss.backward()
            opt.step()
            t.rec(loss=loss)
            mon.log(loss=loss)
            step += 1
    return t


# fmt: off
BROKEN = (
    Scenario("hb_gru_adc_counts", "inputs", "raw 12-bit ADC counts (0..4095) into a GRU",
             gru_adc_counts, 300, 150, ("inputs_not_normalised",), "gru.weight_ih_l0",
             source="blog.slavv.com 37 Reasons #10; karpathy.github.io/2019/04/25/recipe/",
             signal="GRU inputs |x| ~ 2e3", check=lambda t: need(
                 t.first("x_abs") > 1000, "inputs are not large")),
    Scenario("hb_images_labels_two_shuffles", "inputs",
             "images and labels shuffled by two separate permutations each epoch",
             two_separate_shuffles, 400, 300, ("labels_not_matching",),
             source="karpathy.github.io/2019/04/25/recipe/; blog.slavv.com 37 Reasons #3",
             signal="the loss stays at log(4) while gradients flow",
             check=lambda t: need(t.last("loss", 50) > 0.9 * math.log(4), "below chance")),
)
# fmt: on
