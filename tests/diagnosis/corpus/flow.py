"""Gradient flow: a detached loss, a spike at one layer, an explosion inside a clipped loop,
Adam with lr 1.0, vanishing gradients."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, SmallCNN, Teacher, mlp
from tests.diagnosis.corpus._common import Trace, grad_norm, need, stalls
from torch import nn


def loss_rebuilt_from_item(steps: int, attach: Attach) -> Trace:
    # Source: deepinout.com/pytorch/pytorch-questions/75_pytorch_runtime_error_element_0_of_
    # tensors_does_not_require_grad_and_does_not_have_a_grad_fn.html (.item() cuts the graph)
    # and the most common wrong fix of that error, ``loss = torch.tensor(loss.item(),
    # requires_grad=True)`` (a loss computed with numpy, or to silence the error).
    # Signal: the tensor backward() runs on is a leaf cut from the model: no parameter ever
    # gets a gradient; the loss does not move.
    model = mlp(width=16, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        value = nn.functional.cross_entropy(model(x), y).item()
        loss = torch.tensor(value, requires_grad=True)  # the bug
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, grad=grad_norm(model.parameters()))
        mon.log(loss=loss)
    return t


def check_no_grad(t: Trace) -> str:
    return need(max(t["grad"]) == 0.0 and stalls(0.9)(t) == "", "some parameter got a gradient")


SPIKE_AT = 100


def spike_in_conv2(steps: int, attach: Attach) -> Trace:
    # Source: Karpathy's recipe ("visualize ... gradients"; a bad batch or a kernel bug) and
    # the issue's own report: a spike injected in one layer must be named there, not at the
    # input layer. Here a custom op in conv2's output multiplies its gradient by 1e3 on one
    # step (a fused kernel's bug), as a forward hook.
    # Signal: on step SPIKE_AT+1 conv2's gradient is ~1000x its own median (and conv1's,
    # upstream, too), while the head's is unchanged.
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    task, t = Patterns(shape=(1, 8, 8)), Trace()

    def blow_up(module: nn.Module, args: object, output: torch.Tensor) -> None:
        output.register_hook(lambda grad: grad * 1000.0)

    mon = attach(model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        hook = model.conv2.register_forward_hook(blow_up) if step == SPIKE_AT + 1 else None
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if hook is not None:
            hook.remove()
        t.rec(loss=loss, conv2=model.conv2.weight.grad.norm(), head=model.head.weight.grad.norm())
        opt.step()
        mon.log(loss=loss)
    return t


def check_spike(t: Trace) -> str:
    conv2 = t["conv2"]
    median = sorted(conv2[:SPIKE_AT])[SPIKE_AT // 2]
    return need(conv2[SPIKE_AT] > 100 * median, "no spike at conv2")


def warmup_to_high_peak_clipped(steps: int, attach: Attach) -> Trace:
    # Source: PyTorch forum threads "gradient norm keeps growing even with clip_grad_norm_" and
    # Karpathy's recipe (clipping hides a too-high lr): a linear warm-up over the run's first
    # 150 steps to a peak lr of 10 (SGD momentum), clip_grad_norm_(1.0) every step. Clipping
    # bounds each update, so the run goes on while the weights and gradients grow.
    # Signal: the pre-clip gradient norm (what clip_grad_norm_ returns) grows ~100x over the
    # run, every late step is clipped, and the loss climbs 100x.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=10.0, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 150))
    task, t = Teacher(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        t.rec(loss=loss, norm=norm)
        mon.log(loss=loss)
    return t


def check_explodes(t: Trace) -> str:
    big = [v if math.isfinite(v) else 1e30 for v in t["norm"]]
    return need(
        max(big[-20:]) > 30 * t.first("norm") and t.last("loss") > 10 * t.first("loss"),
        f"pre-clip norm {big[0]:.3g} -> {big[-1]:.3g}: no growing explosion",
    )


def adam_lr_one(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons", #34 (too high learning rate) and the issue's report ("lr 1.0 with
    # Adam"): Adam(lr=1.0), an SGD lr carried over to Adam.
    # Signal: every step moves each weight by ~1.0, larger than the weights themselves
    # (||dw||/||w|| ~ 1); the loss jumps far above its start.
    model = mlp(width=16, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=1.0)
    task, t = Patterns(), Trace()
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


def check_jumps(t: Trace) -> str:
    worst = max((v if math.isfinite(v) else math.inf) for v in t["loss"])
    return need(worst > 10 * t["loss"][0], f"the loss never passed 10x its start ({worst:.3g})")


def vanishing_deep_tanh(steps: int, attach: Attach) -> Trace:
    # Source: Karpathy's recipe (init) and "37 Reasons", #28 "Check the weight
    # initialisation": 20 tanh layers initialised N(0, 0.05^2) (a tutorial's "small random
    # numbers"), no normalisation.
    # Signal: the first layers' gradients are ~1e-10 of the last's; the loss does not move.
    model = mlp(width=16, depth=20, act=nn.Tanh)
    with torch.no_grad():
        for module in model:
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, 0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    task, t = Teacher(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        t.rec(loss=loss, first=model[0].weight.grad.norm(), last=model[40].weight.grad.norm())
        opt.step()
        mon.log(loss=loss)
    return t


def check_vanishing(t: Trace) -> str:
    return need(t.first("first") < 1e-6 * t.first("last"), "the first layer's gradient is not tiny")


# fmt: off
BROKEN = (
    Scenario("loss_from_item_leaf", "flow", "loss = torch.tensor(loss.item(), requires_grad=True)",
             loss_rebuilt_from_item, 200, 60, ("loss_detached",),
             source="deepinout.com: element 0 of tensors does not require grad (.item() cuts it)",
             signal="backward() on a leaf: no parameter ever gets a gradient",
             check=check_no_grad),
    Scenario("spike_at_conv2", "flow", f"conv2's gradient x1000 on step {SPIKE_AT + 1} only",
             spike_in_conv2, 300, 160, ("gradient_spike",), "conv2.weight", SPIKE_AT,
             source="karpathy.github.io/2019/04/25/recipe/; issue 42 (named at the input layer)",
             signal="conv2's gradient 1000x its median on one step, the head's unchanged",
             check=check_spike),
    Scenario("warmup_peak_10_clipped", "flow",
             "warm-up to SGD lr 10, clip_grad_norm_(1.0) every step: growing explosion",
             warmup_to_high_peak_clipped, 300, 150, ("exploding_gradients", "lr_too_high"),
             source="PyTorch forum: gradient norm grows despite clipping; Karpathy's recipe",
             signal="pre-clip grad norm grows ~100x over the run, the loss 100x",
             check=check_explodes),
    Scenario("adam_lr_1", "flow", "Adam(lr=1.0) on an MLP classifier", adam_lr_one, 200, 60,
             ("lr_too_high", "update_ratio_high"),
             source="blog.slavv.com 37 Reasons #34; issue 42 (Adam lr 1.0)",
             signal="||dw||/||w|| ~ 1 a step; the loss 10x its start", check=check_jumps),
    Scenario("deep_tanh_tiny_init", "flow", "20 tanh layers initialised N(0, 0.05^2)",
             vanishing_deep_tanh, 200, 60, ("vanishing_gradients",), "0.weight",
             source="karpathy.github.io/2019/04/25/recipe/; blog.slavv.com 37 Reasons #28",
             signal="first-layer gradient < 1e-6 of the last's", check=check_vanishing),
)
# fmt: on
