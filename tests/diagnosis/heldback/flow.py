"""Held back. Gradient flow, other models and settings."""

from __future__ import annotations

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, Teacher, TinyTransformer, reverse_batch
from tests.diagnosis.corpus._common import BNConvNet, Trace, grad_norm, need
from torch import nn


def forward_under_no_grad(steps: int, attach: Attach) -> Trace:
    # Source: PyTorch forum, "element 0 of tensors does not require grad" where the training
    # step was copied from an evaluation function (forward under torch.no_grad()), and the
    # error silenced with ``loss.requires_grad = True``.
    # Signal: the loss backward() runs on is a leaf with no graph to the model; no parameter
    # ever gets a gradient; the loss does not move.
    model = BNConvNet(bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    task, t = Patterns(shape=(1, 8, 8), seed=101), Trace()
    attach(model, opt, total_steps=steps)  # this user does not call mon.log
    for _ in range(steps):
        x, y = task.batch()
        with torch.no_grad():  # the bug: copied from evaluate()
            logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        loss.requires_grad = True  # ... and the error silenced
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss, grad=grad_norm(model.parameters()))
    return t


SPIKE_AT = 120


def spike_in_transformer_mlp(steps: int, attach: Attach) -> Trace:
    # Source: the report (a spike injected in one layer named at the input layer)
    # and Karpathy's recipe (look at per-layer gradients): one step's gradient through the
    # second block's MLP is multiplied by 500 (a custom kernel's bug), then normal again.
    # Signal: on step SPIKE_AT+1, blocks.1.mlp.0's gradient is ~500x its median; the head,
    # after it, is unchanged.
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    g, t = torch.Generator().manual_seed(102), Trace()
    target = model.blocks[1].mlp[0]

    def blow_up(module: nn.Module, args: object, output: torch.Tensor) -> None:
        output.register_hook(lambda grad: grad * 500.0)

    mon = attach(model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        hook = target.register_forward_hook(blow_up) if step == SPIKE_AT + 1 else None
        x, y = reverse_batch(g)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        if hook is not None:
            hook.remove()
        t.rec(loss=loss, mlp=target.weight.grad.norm())
        opt.step()
        mon.log(loss=loss)
    return t


def check_spike(t: Trace) -> str:
    median = sorted(t["mlp"][:SPIKE_AT])[SPIKE_AT // 2]
    return need(t["mlp"][SPIKE_AT] > 100 * median, "no spike")


def drifting_targets_clipped(steps: int, attach: Attach) -> Trace:
    # Source: "37 Reasons", #10/#11 (normalise the outputs too) and forum threads "gradient
    # norm keeps growing even with clip_grad_norm_": regression targets in raw units that
    # drift upward through the data (a cumulative counter), never standardised; the loop
    # clips at 1.0, so it keeps running.
    # Signal: the pre-clip gradient norm grows steadily (~100x over the run), every late step
    # is clipped, the loss climbs.
    model = nn.Sequential(
        nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    task, t = Teacher(seed=103), Trace()
    mon = attach(model, opt, total_steps=steps)
    for step in range(steps):
        x, y = task.batch()
        y = y + 0.2 * step  # the bug: raw, drifting targets
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t.rec(loss=loss, norm=norm)
        mon.log(loss=loss)
    return t


def check_growing(t: Trace) -> str:
    return need(t.last("norm") > 20 * t.first("norm", 10), "the pre-clip norm did not grow")


class SigmoidCNN(nn.Module):
    """8 conv layers with sigmoids and no normalisation: a 2012 architecture."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(1 if i == 0 else 8, 8, 3, padding=1) for i in range(8))
        self.head = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.sigmoid(conv(x))
        return self.head(x.flatten(1))


def vanishing_sigmoid_cnn(steps: int, attach: Attach) -> Trace:
    # Source: Karpathy's recipe and "37 Reasons", #30 ("vanishing gradients: sigmoid
    # activations saturate"): 8 sigmoid conv layers, no normalisation, SGD.
    # Signal: the first conv's gradient is ~1e-5 of the head's; the loss stays at chance.
    model = SigmoidCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    task, t = Patterns(shape=(1, 8, 8), seed=104), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        t.rec(
            loss=loss, first=model.convs[0].weight.grad.norm(), head=model.head.weight.grad.norm()
        )
        opt.step()
        mon.log(loss=loss)
    return t


# fmt: off
BROKEN = (
    Scenario("hb_forward_in_no_grad", "flow",
             "forward under torch.no_grad(), then loss.requires_grad = True (CNN)",
             forward_under_no_grad, 200, 60, ("loss_detached",),
             source="PyTorch forum: element 0 of tensors does not require grad (no_grad forward)",
             signal="backward on a leaf: no parameter ever gets a gradient",
             check=lambda t: need(max(t["grad"]) == 0.0, "a parameter got a gradient")),
    Scenario("hb_spike_transformer_mlp", "flow",
             f"blocks.1.mlp.0's gradient x500 on step {SPIKE_AT + 1} only",
             spike_in_transformer_mlp, 300, 180, ("gradient_spike",), "blocks.1.mlp.0.weight",
             SPIKE_AT, source="issue 42 (spike named at the input layer); Karpathy's recipe",
             signal="blocks.1.mlp.0's gradient 500x its median on one step",
             check=check_spike),
    Scenario("hb_drifting_targets_clipped", "flow",
             "raw targets drifting upward, clip_grad_norm_(1.0) every step",
             drifting_targets_clipped, 300, 200, ("exploding_gradients",),
             source="blog.slavv.com 37 Reasons #10-11; forum: grad norm grows despite clipping",
             signal="pre-clip gradient norm grows ~100x, every late step clipped",
             check=check_growing),
    Scenario("hb_sigmoid_cnn_8_layers", "flow", "8 sigmoid conv layers, no normalisation",
             vanishing_sigmoid_cnn, 200, 80, ("vanishing_gradients",), "convs.0.weight",
             source="karpathy.github.io/2019/04/25/recipe/; blog.slavv.com 37 Reasons #30",
             signal="first conv's gradient ~1e-5 of the head's",
             check=lambda t: need(t.first("first") < 1e-3 * t.first("head"), "not vanishing")),
)
# fmt: on
