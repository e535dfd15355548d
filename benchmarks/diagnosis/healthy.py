"""Healthy runs of different families: every alert on one is a false alarm."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from benchmarks.diagnosis.harness import LOAD_PER_CORE, Attach, Scenario
from benchmarks.diagnosis.models import (
    BatchNormCNN,
    LoRATask,
    Patterns,
    ResidualTanh,
    SmallCNN,
    Teacher,
    TinyTransformer,
    cosine_warmup,
    mlp,
    reverse_batch,
)
from torch import nn


def regression(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    steps: int,
    attach: Attach,
    *,
    sched: torch.optim.lr_scheduler.LRScheduler | None = None,
    clip: float | None = None,
    width: int = 16,
    at_step: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    **options: object,
) -> None:
    """A regression loop on a ``Teacher`` task. ``at_step(step, x)`` (steps from 1) returns
    the batch the step trains on: where a broken run puts its bug."""
    task = Teacher(width)
    mon = attach(model, opt, total_steps=steps, **options)
    for step in range(1, steps + 1):
        x, y = task.batch()
        if at_step is not None:
            x = at_step(step, x)
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        mon.log(loss=loss)


def mlp_adam_long(steps: int, attach: Attach) -> None:
    # Converges to a loss near 1e-5 and below: the README screenshot's case.
    model = mlp(width=16, depth=3)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    regression(model, opt, steps, attach, sched=cosine_warmup(opt, 1, steps))


def mlp_sgd_steplr(steps: int, attach: Attach) -> None:
    model = mlp(width=16, depth=2, act=nn.Tanh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, steps // 3), gamma=0.3)
    regression(model, opt, steps, attach, sched=sched)


def sgd_momentum_regression(steps: int, attach: Attach) -> None:
    # Plain SGD with momentum from the first step: early updates are large against the small
    # initial weights of some layers while the momentum builds, and that is healthy.
    model = mlp(width=16, depth=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    regression(model, opt, steps, attach)


def sgd_momentum_small_head(steps: int, attach: Attach) -> None:
    # lr 0.1 with momentum 0.9: the 16-weight head moves by up to 15% of its norm per step
    # while the momentum builds (from step 20 on), with the loss falling fast all along.
    model = mlp(width=16, depth=1, act=nn.Tanh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    regression(model, opt, steps, attach)


def mlp_clipped(steps: int, attach: Attach) -> None:
    # Clipping as a guard rail: active on a few steps, not most.
    model = mlp(width=16, depth=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    regression(model, opt, steps, attach, clip=1.0)


def mlp_relu_activations(steps: int, attach: Attach) -> None:
    # ReLU units that are zero on part of the inputs are healthy, not dead.
    model = mlp(width=32, depth=3, act=nn.ReLU)
    with torch.no_grad():
        model[0].weight.mul_(0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    regression(model, opt, steps, attach, activations=True, width=32)


def residual_tanh(steps: int, attach: Attach) -> None:
    model = ResidualTanh(width=16, depth=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    regression(model, opt, steps, attach)


def cnn(steps: int, attach: Attach, model: nn.Module | None = None) -> None:
    model = model if model is not None else SmallCNN()
    task = Patterns(shape=(1, 8, 8), noise=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)


def cnn_batchnorm(steps: int, attach: Attach) -> None:
    # Conv biases right before BatchNorm: their gradient is zero by construction (healthy).
    cnn(steps, attach, BatchNormCNN())


def transformer(steps: int, attach: Attach) -> None:
    # Warm-up, cosine decay and clipping, as a language model is trained.
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = cosine_warmup(opt, warmup=min(50, steps // 10), total=steps)
    g = torch.Generator().manual_seed(3)
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = reverse_batch(g)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        mon.log(loss=loss)


def fine_tune(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    task: LoRATask,
    steps: int,
    attach: Attach,
    *,
    sched: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> None:
    """Regress a ``LoRATask``'s target with ``model`` (its adapters on the task's base)."""
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        mon.log(loss=loss)


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def lora(steps: int, attach: Attach) -> None:
    # A frozen base with low-rank adapters; only the adapters are in the optimizer.
    task = LoRATask()
    model = task.model()
    fine_tune(model, torch.optim.AdamW(trainable(model), lr=3e-3), task, steps, attach)


def lora_warmup_dropout(steps: int, attach: Attach) -> None:
    # As most LoRA recipes run: dropout 0.1 in the adapters, a linear warm-up from lr 0 then a
    # cosine decay, and AdamW handed model.parameters() (the frozen base in it, skipped).
    task = LoRATask()
    model = task.model(dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup  # 0 at the first step
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (steps - warmup))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    fine_tune(model, opt, task, steps, attach, sched=sched)


def lora_biases_trained(steps: int, attach: Attach) -> None:
    # The base's biases trained beside the adapters on purpose (peft's bias="all").
    task = LoRATask()
    model = task.model()
    for layer in (task.base[0], task.base[2]):
        layer.bias.requires_grad_(True)
    fine_tune(model, torch.optim.AdamW(trainable(model), lr=3e-3), task, steps, attach)


def lora_sgd(steps: int, attach: Attach) -> None:
    # Adapters trained with SGD and momentum: B leaves zero more slowly than with AdamW.
    task = LoRATask()
    model = task.model()
    opt = torch.optim.SGD(trainable(model), lr=0.1, momentum=0.9)
    fine_tune(model, opt, task, steps, attach)


def classify_sgd_long(steps: int, attach: Attach) -> None:
    # A classifier that reaches ~0 loss and stays there for thousands of steps.
    model = mlp(width=16, depth=2, out=4)
    task = Patterns(noise=0.2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)


def classify_adam_small_batch(steps: int, attach: Attach) -> None:
    # Batches of 8 on a classifier that converges to ~1e-5: most steps' gradients are tiny,
    # a hard sample now and then makes one 100x-1000x the rest (the heavy tail of a converged
    # run's noise, not a spike).
    model = mlp(width=16, depth=2, out=4)
    task = Patterns(noise=0.4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(8)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)


def _slow_forward(module: nn.Module, args: object, output: object) -> None:
    time.sleep(0.05)


def wide_activations(steps: int, attach: Attach) -> None:
    # Large activations every step (a 256 x 2048 hidden layer, freed after the backward):
    # memory rises and falls each step and its floor stays put. Losses kept as numbers. A
    # sleep in the forward stands in for a real step's work, as in ``broken.leaking_loop``.
    model = nn.Sequential(nn.Linear(16, 2048), nn.ReLU(), nn.Linear(2048, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task = Teacher(16)
    model.register_forward_hook(_slow_forward)
    mon = attach(model, opt, total_steps=steps)
    losses = []
    for _ in range(steps):
        x, y = task.batch(256)
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        mon.log(loss=loss)


def classify_eval_passes_accumulate(steps: int, attach: Attach) -> None:
    # Dropout and BatchNorm, an evaluation pass every 50 steps (model.eval() + no_grad, then
    # model.train()), two micro-batches a step, zero_grad(set_to_none=False) after the step:
    # the structural causes (eval mode, zero_grad, step order) stay silent.
    # (No bias before the BatchNorm: update_ratio_low names a Linear bias there, a zero update
    # by construction; cnn_batchnorm is the scenario for that pattern.)
    model = nn.Sequential(
        nn.Linear(16, 32, bias=False), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(32, 4),
    )  # fmt: skip
    task = Patterns(noise=0.2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = attach(model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        total = 0.0
        for _ in range(2):
            x, y = task.batch(16)
            loss = nn.functional.cross_entropy(model(x), y) / 2
            loss.backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=False)
        mon.log(loss=total)
        if step % 50 == 0:
            model.eval()
            with torch.no_grad():
                x, y = task.batch(4)
                nn.functional.cross_entropy(model(x), y)
            model.train()


def classify_log_softmax_model_zero_grad(steps: int, attach: Attach) -> None:
    # log_softmax + nll_loss (correct), model.zero_grad() instead of the optimizer's.
    model = mlp(width=16, depth=2, out=4)
    task = Patterns(noise=0.2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        model.zero_grad()
        loss = nn.functional.nll_loss(torch.log_softmax(model(x), dim=-1), y)
        loss.backward()
        opt.step()
        mon.log(loss=loss)


HEALTHY = (
    Scenario("mlp_adam_long", "MLP", "Adam + cosine decay, converges to ~1e-5", mlp_adam_long,
             6000, 2500),
    Scenario("classify_sgd_long", "MLP", "SGD classifier, loss to ~0 and flat", classify_sgd_long,
             5000, 1000),
    Scenario("classify_adam_small_batch", "MLP", "Adam classifier, batches of 8, loss to ~1e-5",
             classify_adam_small_batch, 5000, 3000),
    Scenario("mlp_sgd_steplr", "MLP", "SGD momentum + StepLR, tanh", mlp_sgd_steplr, 2000, 400),
    Scenario("sgd_momentum", "MLP", "SGD momentum 0.9, lr 0.05, no schedule",
             sgd_momentum_regression, 4000, 400),
    Scenario("sgd_momentum_head", "MLP", "SGD momentum 0.9, lr 0.1, tanh, a small head",
             sgd_momentum_small_head, 3000, 400),
    Scenario("mlp_clipped", "MLP", "SGD momentum + clip_grad_norm_(1.0)", mlp_clipped, 2000, 400),
    Scenario("mlp_relu_activations", "MLP", "AdamW, activations=True", mlp_relu_activations,
             1500, 300),
    Scenario("residual_tanh", "MLP", "8 pre-norm residual tanh blocks, Adam", residual_tanh,
             1500, 300),
    Scenario("cnn", "CNN", "2 conv layers, Adam, 4 classes", cnn, 1500, 300),
    Scenario("cnn_batchnorm", "CNN", "conv (with bias) -> BatchNorm x2, Adam", cnn_batchnorm,
             1500, 300),
    Scenario("transformer", "transformer", "2 blocks, AdamW + warm-up/cosine + clipping",
             transformer, 1500, 300),
    Scenario("lora", "LoRA", "frozen base, rank-4 adapters, AdamW", lora, 1500, 300),
    Scenario("lora_warmup_dropout", "LoRA",
             "adapter dropout 0.1, warm-up from lr 0 + cosine, AdamW(model.parameters())",
             lora_warmup_dropout, 1500, 300),
    Scenario("lora_biases_trained", "LoRA", "adapters, and the base's biases trained (bias='all')",
             lora_biases_trained, 1500, 300),
    Scenario("lora_sgd", "LoRA", "adapters with SGD momentum 0.9", lora_sgd, 1500, 300),
    # On a shared machine: a CPU-bound process per core competes with the loop for the whole
    # run (the timing rules judge against the run's own noise, and stay silent).
    Scenario("residual_tanh_busy", "MLP", "residual_tanh beside a busy process per core",
             residual_tanh, 1500, 300, load=LOAD_PER_CORE),
    Scenario("transformer_busy", "transformer", "transformer beside a busy process per core",
             transformer, 1500, 300, load=LOAD_PER_CORE),
    Scenario("mlp_adam_busy", "MLP", "mlp_adam_long beside a busy process per core",
             mlp_adam_long, 3000, 1000, load=LOAD_PER_CORE),
    Scenario("wide_activations", "MLP", "256 x 2048 activations a step, losses kept as numbers",
             wide_activations, 600, 200),
    Scenario("eval_passes_accumulate", "MLP",
             "dropout + BatchNorm, eval passes, 2 micro-batches, zero_grad(set_to_none=False)",
             classify_eval_passes_accumulate, 1500, 400),
    Scenario("log_softmax_model_zero_grad", "MLP", "log_softmax + nll_loss, model.zero_grad()",
             classify_log_softmax_model_zero_grad, 1500, 400),
)  # fmt: skip
