"""Precision: float16 parameters trained with Adam; float16 autocast without a GradScaler
(GPU only)."""

from __future__ import annotations

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, Teacher, mlp
from tests.diagnosis.corpus._common import Trace, need
from torch import nn


def half_params_adam(steps: int, attach: Attach) -> Trace:
    # Source: PyTorch forum, "Adam+Half Precision = NaNs?" (discuss.pytorch.org/t/adam-half-
    # precision-nans/1765): model.half() then Adam with the default eps=1e-8, which is 0 in
    # float16; the fix is float32 master weights (autocast) or a larger eps.
    # Signal: the parameters are float16 and Adam steps them; the updates underflow/round
    # away or turn the weights non-finite; the loss does not come down as in float32.
    model = mlp(width=16, out=4).half()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x.half()).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, w=model[0].weight.float().abs().max())
        mon.log(loss=loss)
    return t


def check_half(t: Trace) -> str:
    broke = not t.finite("loss") or not t.finite("w") or t.last("loss") > 0.5 * t.first("loss")
    return need(broke, f"float16 Adam trained fine: {t.first('loss'):.3g} -> {t.last('loss'):.3g}")


def fp16_autocast_without_scaler(steps: int, attach: Attach) -> Trace:
    # Source: PyTorch AMP docs ("Gradient Scaling": without it small float16 gradients flush
    # to zero) and the forum threads "AMP without GradScaler: loss does not decrease".
    # Signal: float16 autocast and no GradScaler; most of the first layer's gradient entries
    # are exactly 0 (underflowed) and the model learns far slower than in float32.
    dev = torch.device("cuda")
    model = mlp(width=16, depth=3).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    task, t = Teacher(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(256)
        x, y = x.to(dev), y.to(dev)
        with torch.autocast("cuda", dtype=torch.float16):
            # A loss of small magnitude (weighted 1e-5, as an auxiliary or KL term often is):
            # its gradients fall below float16's smallest subnormal (6e-8).
            loss = nn.functional.mse_loss(model(x), y) * 1e-5
        opt.zero_grad()
        loss.backward()  # the bug: no GradScaler
        opt.step()
        g = model[0].weight.grad
        t.rec(loss=loss, zeros=(g == 0).float().mean() if g is not None else 1.0)
        mon.log(loss=loss)
    return t


def check_underflow(t: Trace) -> str:
    return need(t.first("zeros") > 0.5, f"only {t.first('zeros'):.0%} of the gradient underflowed")


# fmt: off
BROKEN = (
    Scenario("half_params_adam_mlp", "precision", "model.half() trained with Adam (eps 1e-8)",
             half_params_adam, 300, 120, ("fp16_params_with_adam",), "0.weight",
             source="discuss.pytorch.org/t/adam-half-precision-nans/1765",
             signal="float16 parameters stepped by Adam: NaN or frozen weights",
             check=check_half),
)

GPU_ONLY = (
    Scenario("fp16_autocast_no_scaler", "precision",
             "float16 autocast on CUDA without a GradScaler, a loss weighted 1e-5",
             fp16_autocast_without_scaler, 300, 120, ("fp16_without_scaler",),
             source="pytorch.org/docs/stable/amp.html#gradient-scaling; forum: AMP without scaler",
             signal="float16 autocast, no scaler; most gradient entries exactly 0",
             check=check_underflow, gpu=True),
)
# fmt: on
