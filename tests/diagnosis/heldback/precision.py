"""Held back. Precision, other models and settings."""

from __future__ import annotations

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, SmallCNN, Teacher
from tests.diagnosis.corpus._common import Trace, need
from torch import nn


def half_adamw_regression(steps: int, attach: Attach) -> Trace:
    # Source: discuss.pytorch.org/t/adam-half-precision-nans/1765 ("the default 1e-8 is
    # rounded to 0 in half precision") and the mixed-precision guides (keep float32 master
    # weights): a regression MLP cast with .to(torch.float16), AdamW lr 1e-4.
    # Signal: float16 parameters stepped by AdamW; NaN, or updates below float16's spacing
    # that round away so the loss stops falling.
    model = nn.Sequential(
        nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1)
    ).to(torch.float16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    task, t = Teacher(seed=71), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.mse_loss(model(x.half()).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def check_half(t: Trace) -> str:
    ok = not t.finite("loss") or t.last("loss") > 0.5 * t.first("loss")
    return need(ok, f"float16 AdamW trained: {t.first('loss'):.3g} -> {t.last('loss'):.3g}")


def cnn_fp16_autocast_no_scaler(steps: int, attach: Attach) -> Trace:
    # Source: pytorch.org/docs/stable/amp.html (gradient scaling: "gradients with small
    # magnitudes may not be representable in float16 ... flush to zero") and forum threads
    # "autocast without GradScaler, grads are zero": a CNN whose loss is small (a
    # down-weighted term), float16 autocast, no GradScaler.
    # Signal: float16 autocast without a scaler; most of conv1's gradient entries are 0.
    dev = torch.device("cuda")
    model = SmallCNN().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    task, t = Patterns(shape=(1, 8, 8), seed=72), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(64)
        x, y = x.to(dev), y.to(dev)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y) * 1e-6  # a down-weighted term
        opt.zero_grad()
        loss.backward()  # the bug: no GradScaler
        opt.step()
        g = model.conv1.weight.grad
        t.rec(loss=loss, zeros=(g == 0).float().mean() if g is not None else 1.0)
        mon.log(loss=loss)
    return t


# fmt: off
BROKEN = (
    Scenario("hb_half_adamw_regression", "precision", ".to(float16) MLP trained with AdamW",
             half_adamw_regression, 300, 150, ("fp16_params_with_adam",), "0.weight",
             source="discuss.pytorch.org/t/adam-half-precision-nans/1765",
             signal="float16 parameters stepped by AdamW", check=check_half),
)

GPU_ONLY = (
    Scenario("hb_cnn_fp16_autocast_no_scaler", "precision",
             "CNN, float16 autocast, a down-weighted loss, no GradScaler",
             cnn_fp16_autocast_no_scaler, 300, 120, ("fp16_without_scaler",),
             source="pytorch.org/docs/stable/amp.html gradient scaling; forum threads",
             signal="float16 autocast without scaler; most gradient entries exactly 0",
             check=lambda t: need(t.first("zeros") > 0.5, "the gradients did not underflow"),
             gpu=True),
)
# fmt: on
