"""Broken runs, one training bug each, with the rule and the layer that should name it."""

from __future__ import annotations

import time

import torch
from benchmarks.diagnosis.harness import LOAD_PER_CORE, Attach, Scenario
from benchmarks.diagnosis.healthy import _slow_forward, fine_tune, regression, trainable
from benchmarks.diagnosis.models import (
    BatchNormCNN,
    LoRALinear,
    LoRATask,
    ManyRows,
    Patterns,
    Teacher,
    TwoTower,
    mlp,
)
from torch import nn
from torch.utils.checkpoint import checkpoint

TIMING_LATE = (
    "a timing verdict is said once it has held over 100 steps (PERSIST_STEPS), so that a busy "
    "neighbour cannot raise it"
)
PLATEAU_LATE = (
    "a plateau is told from slow learning only over plateau_window (200) steps of a loss "
    "that has not moved"
)


def classify(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    steps: int,
    attach: Attach,
    *,
    shuffle_labels: bool = False,
    clip: float | None = None,
    **options: object,
) -> None:
    task = Patterns()
    mon = attach(model, opt, total_steps=steps, **options)
    for _ in range(steps):
        x, y = task.batch()
        if shuffle_labels:
            y = y[torch.randperm(y.numel())]  # the bug: labels no longer match inputs
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)


def lr_too_high(steps: int, attach: Attach) -> None:
    # Diverges within a few steps to a loss 50x where it started, without NaN.
    model = mlp()
    regression(model, torch.optim.SGD(model.parameters(), lr=1.0), steps, attach)


def adam_lr_too_high(steps: int, attach: Attach) -> None:
    # Adam lr 1.0: the first step moves every weight by several times its size; the loss
    # jumps six orders of magnitude, then the ReLUs die and it settles above where it began.
    model = mlp()
    regression(model, torch.optim.Adam(model.parameters(), lr=1.0), steps, attach)


def lr_too_high_clipped(steps: int, attach: Attach) -> None:
    # SGD lr 2.0 with momentum inside a loop that clips to 1.0: the pre-clip norm jumps 80x in
    # ten steps and stays 20x up, the loss climbs 10x; clipping hides it from the update only.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=2.0, momentum=0.9)
    regression(model, opt, steps, attach, clip=1.0)


def schedule_per_batch(steps: int, attach: Attach) -> None:
    # ExponentialLR(gamma=0.9) meant per epoch, stepped every batch: the lr is 1e-3 of its
    # start by step 66 and ~1e-15 by step 330, long before the run ends.
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    regression(model, opt, steps, attach, sched=sched)


def weight_decay_high(steps: int, attach: Attach) -> None:
    # AdamW weight_decay=100 (where 0.01 was meant): each step pulls every weight 10 % towards
    # zero, far more than the gradient pushes back.
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=100.0)
    regression(model, opt, steps, attach)


def labels_misaligned(steps: int, attach: Attach) -> None:
    # A 10-way head on a 4-class task whose labels are shuffled: the loss falls from ln 10 to
    # ln 4 (it learns which labels occur) and stays there.
    model = mlp(out=10)
    classify(model, torch.optim.SGD(model.parameters(), lr=0.1), steps, attach,
             shuffle_labels=True)  # fmt: skip


def lr_to_nan(steps: int, attach: Attach) -> None:
    model = mlp()
    regression(model, torch.optim.SGD(model.parameters(), lr=3.0), steps, attach)


SPIKE_AT = 200


def lr_spike_mid_run(steps: int, attach: Attach) -> None:
    # A scheduler bug: from step SPIKE_AT the learning rate is 100x what it was.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    def spike(step: int, x: torch.Tensor) -> torch.Tensor:
        if step == SPIKE_AT + 1:
            for group in opt.param_groups:
                group["lr"] *= 100
        return x

    regression(model, opt, steps, attach, at_step=spike)


def lr_too_low(steps: int, attach: Attach) -> None:
    model = mlp()
    regression(model, torch.optim.Adam(model.parameters(), lr=1e-9), steps, attach)


def adam_eps_huge(steps: int, attach: Attach) -> None:
    # eps=1e3 where 1e-8 was meant: the denominator swamps the second moment and the
    # optimizer state updates almost nothing; the loss stalls where it started.
    model = mlp()
    regression(model, torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e3), steps, attach)


EXPLODE_AT = 150


def explode_mid_run(steps: int, attach: Attach) -> None:
    # From step EXPLODE_AT one input feature arrives 1000x too large (a unit change upstream):
    # the first layer's gradient explodes, Adam keeps the rest of the run going.
    def scaled(step: int, x: torch.Tensor) -> torch.Tensor:
        if step > EXPLODE_AT:
            x = x.clone()
            x[:, 3] *= 1000.0
        return x

    model = mlp()
    regression(model, torch.optim.Adam(model.parameters(), lr=1e-3), steps, attach, at_step=scaled)


GRAD_SPIKE_AT = 120


def grad_spike(steps: int, attach: Attach, clip: float | None = None) -> None:
    # At one step the gradient reaching the middle Linear (module 2) is 1000x what it should
    # be (a fused kernel's bug, a bad loss-scale hand-off): it and every layer before it get a
    # 1000x gradient for that step only; the head (4) does not.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    task = Teacher()

    def blow_up(module: nn.Module, args: object, output: torch.Tensor) -> None:
        output.register_hook(lambda grad: grad * 1000.0)

    mon = attach(model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        handle = model[2].register_forward_hook(blow_up) if step == GRAD_SPIKE_AT + 1 else None
        x, y = task.batch()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        if handle is not None:
            handle.remove()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)


def grad_spike_clipped(steps: int, attach: Attach) -> None:
    grad_spike(steps, attach, clip=1.0)


def vanishing_sigmoid(steps: int, attach: Attach) -> None:
    model = mlp(width=16, depth=24, act=nn.Sigmoid)
    regression(model, torch.optim.SGD(model.parameters(), lr=0.01), steps, attach)


def bad_init_small(steps: int, attach: Attach) -> None:
    # Weights initialised 1000x too small in a deep ReLU net: the first layers get ~nothing.
    model = mlp(width=16, depth=8)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e-3)
    regression(model, torch.optim.SGD(model.parameters(), lr=0.01), steps, attach)


def dead_relu(steps: int, attach: Attach) -> None:
    model = mlp(width=16, depth=2)
    with torch.no_grad():
        model[2].bias.fill_(-50.0)  # every pre-activation of ReLU 3 is negative
    regression(model, torch.optim.SGD(model.parameters(), lr=0.01), steps, attach,
               activations=True)  # fmt: skip


def detached_branch(steps: int, attach: Attach) -> None:
    model = TwoTower(detach=True)
    regression(model, torch.optim.Adam(model.parameters(), lr=1e-3), steps, attach)


def missing_from_optimizer(steps: int, attach: Attach) -> None:
    model = mlp()
    params = [p for m in list(model)[:-1] for p in m.parameters()]  # the head is forgotten
    regression(model, torch.optim.SGD(params, lr=0.01), steps, attach)


def frozen_in_optimizer(steps: int, attach: Attach) -> None:
    model = mlp()
    model[0].requires_grad_(False)  # frozen, yet handed to the optimizer
    regression(model, torch.optim.SGD(model.parameters(), lr=0.01), steps, attach)


def lr_zero(steps: int, attach: Attach) -> None:
    model = mlp()
    regression(model, torch.optim.SGD(model.parameters(), lr=0.0), steps, attach)


NAN_AT = 100


def nan_batch(steps: int, attach: Attach) -> None:
    def corrupt(step: int, x: torch.Tensor) -> torch.Tensor:
        if step == NAN_AT + 1:
            x = x.clone()
            x[5, 2] = float("nan")  # one corrupt sample
        return x

    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    regression(model, opt, steps, attach, at_step=corrupt, check_forward=True)


LOG_ZERO_AT = 100


def log_zero(steps: int, attach: Attach) -> None:
    # Cross-entropy written by hand over all classes, sum(onehot * log(softmax)); from
    # LOG_ZERO_AT a temperature bug sharpens the logits until the wrong classes' probabilities
    # are exactly 0, and 0 * log(0) is NaN.
    model = mlp(out=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task = Patterns()
    mon = attach(model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        x, y = task.batch()
        logits = model(x) * (1e4 if step > LOG_ZERO_AT else 1.0)
        probs = torch.softmax(logits, dim=1)
        onehot = nn.functional.one_hot(y, 4).float()
        loss = -(onehot * torch.log(probs)).sum(1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)


def fp16_overflow(steps: int, attach: Attach) -> None:
    # fp16 autocast with inputs far out of scale: the scaled gradients overflow at every
    # scale the GradScaler tries, so it skips step after step.
    model = mlp(width=16, depth=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    task = Teacher()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(64)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = (model(x * 300.0).float() - y).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        mon.log(loss=loss)


def labels_shuffled(steps: int, attach: Attach) -> None:
    model = mlp(out=4)
    classify(model, torch.optim.Adam(model.parameters(), lr=1e-3), steps, attach,
             shuffle_labels=True)  # fmt: skip


def clip_every_step(steps: int, attach: Attach) -> None:
    model = mlp(out=4)
    classify(model, torch.optim.SGD(model.parameters(), lr=0.05), steps, attach, clip=1e-3)


def optimizer_for_loop(steps: int, attach: Attach) -> None:
    # Adam's for-loop implementation over 200 tiny tensors: most of each step is the optimizer
    # stepping them one by one, where fused=True would do it in one kernel.
    torch.manual_seed(0)
    model = ManyRows(200)
    target = torch.randn(4, 200)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x = torch.randn(8, 4)
        loss = (model(x) - x @ target).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)


def slow_data(steps: int, attach: Attach) -> None:
    # Each batch is decoded in the loop's own process and takes 10 ms: most of each step
    # waits for its data.
    def decode(step: int, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.01)  # the slow decode
        return x

    model = mlp(width=16, depth=2)
    regression(model, torch.optim.Adam(model.parameters(), lr=1e-3), steps, attach, at_step=decode)


def leaking_loop(steps: int, attach: Attach) -> None:
    # Each step keeps its output with its graph (``kept.append(out)`` instead of a number):
    # 2 MiB of features a step that are never freed. A real step takes tens of milliseconds;
    # a sleep in the forward stands in for that work, so that the leak is judged per step as
    # it would be.
    model = nn.Sequential(nn.Linear(16, 2048), nn.ReLU(), nn.Linear(2048, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task = Teacher(16)
    model[0].register_forward_hook(_slow_forward)  # the loop calls the layers one by one
    mon = attach(model, opt, total_steps=steps)
    kept = []
    for _ in range(steps):
        x, y = task.batch(256)
        hidden = model[1](model[0](x))
        loss = (model[2](hidden) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        kept.append(hidden)  # the leak: 256 x 2048 floats a step, kept for good
        mon.log(loss=loss)


# -- fine-tuning: adapters on a frozen base ------------------------------------------------------


def lora_ab_zero(steps: int, attach: Attach) -> None:
    # Source: nvidia-cosmos/cosmos-predict2.5 PR #15 ("lora-A initialization all zeros --> No
    # training"), huggingface/peft#793 (B never updated, the model works exactly as the base).
    # Signal: B stays exactly at zero and every adapter gradient is exactly 0.
    task = LoRATask()
    model = task.model()
    for layer in (model[0], model[2]):
        nn.init.zeros_(layer.a.weight)  # the bug: A at zero as well as B
    fine_tune(model, torch.optim.AdamW(trainable(model), lr=3e-3), task, steps, attach)


class _Checkpointed(nn.Module):
    """A frozen first layer, then a LoRA layer under reentrant checkpointing, then a head."""

    def __init__(self, task: LoRATask) -> None:
        super().__init__()
        self.first = task.base[0].requires_grad_(False)
        self.block = LoRALinear(task.base[2])
        self.head = nn.Linear(32, 32)
        with torch.no_grad():
            self.head.weight.copy_(torch.eye(32))
            self.head.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))  # does not require grad: the base is frozen
        return self.head(checkpoint(self.block, h, use_reentrant=True))


def lora_checkpoint_cut(steps: int, attach: Attach) -> None:
    # Source: microsoft/LoRA#120 ("with gradient checkpoint ... all gradients will be None, so
    # lora_A and B will not be updated"), huggingface/transformers#26221. Signal: the
    # adapters' gradients are None every step, their weights never change.
    import warnings

    task = LoRATask()
    model = _Checkpointed(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "None of the inputs have requires_grad=True"
        fine_tune(model, torch.optim.AdamW(trainable(model), lr=3e-3), task, steps, attach)


def lora_optimizer_before_adapters(steps: int, attach: Attach) -> None:
    # Source: huggingface/peft#793 and its duplicates ("LoRA weights not updated"): the
    # optimizer is built on the base model, then the adapters are added. Signal: the adapters
    # require grad and no optimizer group holds them.
    task = LoRATask()
    opt = torch.optim.AdamW(task.base.parameters(), lr=3e-3)
    fine_tune(task.model(), opt, task, steps, attach)


def lora_adapters_frozen(steps: int, attach: Attach) -> None:
    # Source: huggingface/peft#282 and tloen/alpaca-lora#352 ("trainable params: 0": adapters
    # loaded with PeftModel.from_pretrained without is_trainable=True). A head still trains, so
    # backward runs. Signal: every adapter tensor has requires_grad=False.
    task = LoRATask()
    model = nn.Sequential(*task.model(), nn.Linear(32, 32))
    model.requires_grad_(False)
    model[3].requires_grad_(True)
    with torch.no_grad():
        model[3].weight.copy_(torch.eye(32))
        model[3].bias.zero_()
    fine_tune(model, torch.optim.AdamW(model.parameters(), lr=3e-3), task, steps, attach)


def lora_base_unfrozen(steps: int, attach: Attach) -> None:
    # Source: huggingface/diffusers PR #4687 ("Unet's should be frozen for LoRA ... this isn't
    # enforced"), microsoft/LoRA PR #125. Signal: the weights the adapters wrap require grad
    # and the optimizer steps them.
    task = LoRATask()
    model = task.model()
    model.requires_grad_(True)  # the bug: everything trainable again
    fine_tune(model, torch.optim.AdamW(model.parameters(), lr=3e-3), task, steps, attach)


def lora_lr_tiny(steps: int, attach: Attach) -> None:
    # Source: unslothai/unsloth#2142 ("Applying LoRA doesn't change model output": lora_B
    # ~1e-5 after training). Signal: the adapters move ~1e-8 of their norm a step with
    # non-zero gradients, and the loss does not fall.
    task = LoRATask()
    model = task.model()
    fine_tune(model, torch.optim.AdamW(trainable(model), lr=1e-8), task, steps, attach)


# -- the structural causes (the loop's order, the loss's graph, modes, inputs, precision) -------


def _classify_loop(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    steps: int,
    attach: Attach,
    *,
    order: str = "forward backward step zero",
    loss_of: object = None,
    inputs: object = None,
    batch: int = 32,
    at_step: object = None,
) -> None:
    """A classifier on ``Patterns``, its iteration written as ``order`` (the words forward,
    backward, step and zero in the loop's order); ``loss_of(logits, y)`` replaces
    cross-entropy, ``inputs(x)`` what reaches the model, ``at_step(step, model)`` runs first."""
    task = Patterns()
    mon = attach(model, opt, total_steps=steps)
    words = order.split()
    for step in range(1, steps + 1):
        if callable(at_step):
            at_step(step, model)
        x, y = task.batch(batch)
        if callable(inputs):
            x = inputs(x)
        loss = None
        for word in words:
            if word == "forward":
                out = model(x)
                loss = loss_of(out, y) if callable(loss_of) else nn.functional.cross_entropy(out, y)
            elif word == "backward" and loss is not None:
                loss.backward()
            elif word == "step":
                opt.step()
            elif word == "zero":
                opt.zero_grad()
        mon.log(loss=loss)


def zero_grad_forgotten(steps: int, attach: Attach) -> None:
    # Source: "Why do we need to call zero_grad() in PyTorch?" (Stack Overflow 48001598), the
    # most-read PyTorch question on it; Karpathy's "A Recipe for Training Neural Networks".
    # Signal: at each backward the gradient is still the tensor the last step left.
    model = mlp(width=16, depth=2, out=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    _classify_loop(model, opt, steps, attach, order="forward backward step")


def zero_grad_between_backward_and_step(steps: int, attach: Attach) -> None:
    # Source: PyTorch forums, "Model not learning: loss stays the same" (zero_grad() placed
    # after loss.backward()). Signal: the gradients are gone when step() starts.
    model = mlp(width=16, depth=2, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _classify_loop(model, opt, steps, attach, order="zero forward backward zero step")


def step_before_backward(steps: int, attach: Attach) -> None:
    # Source: PyTorch forums "optimizer.step() before loss.backward()", and the UserWarning
    # torch gives for lr_scheduler.step() before optimizer.step() (the same order bug). Signal: each
    # backward starts after the step with no forward since.
    model = mlp(width=16, depth=2, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _classify_loop(model, opt, steps, attach, order="zero forward step backward")


def loss_rebuilt_from_item(steps: int, attach: Attach) -> None:
    # Source: PyTorch forums, "element 0 of tensors does not require grad" answered with
    # torch.tensor(loss.item(), requires_grad=True): the error goes, the model stops learning.
    # Signal: the backward's root is a leaf, its graph reaches no parameter.
    model = mlp(width=16, depth=2, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def detached(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tensor(nn.functional.cross_entropy(out, y).item(), requires_grad=True)

    _classify_loop(model, opt, steps, attach, order="zero forward backward step", loss_of=detached)


def softmax_then_cross_entropy(steps: int, attach: Attach) -> None:
    # Source: PyTorch forums "Do I need a softmax before nn.CrossEntropyLoss?" and the 37
    # Reasons list (#24, "the loss expects logits"). Signal: a Softmax node feeds LogSoftmax.
    model = nn.Sequential(*mlp(width=16, depth=2, out=4), nn.Softmax(dim=-1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _classify_loop(model, opt, steps, attach)


def mse_summed_with_sgd(steps: int, attach: Attach) -> None:
    # Source: PyTorch forums "MSELoss(reduction='sum') explodes" (an lr tuned for the mean);
    # size_average=False in old tutorials. Signal: MseLoss saved reduction=sum, batch 64, and
    # the loss climbs or is lost.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    task = Teacher()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(64)
        loss = nn.functional.mse_loss(model(x), y, reduction="sum")
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)


def raw_pixels(steps: int, attach: Attach) -> None:
    # Source: Karpathy's Recipe ("visualise just before the net"), CS231n's preprocessing
    # notes: images fed as 0-255. Signal: the first layer's mean |x| is ~100.
    model = mlp(width=16, depth=2, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _classify_loop(model, opt, steps, attach, inputs=lambda x: (x.abs() * 100).clamp(0, 255))


def eval_left_on(steps: int, attach: Attach) -> None:
    # Source: PyTorch forums "model.eval() and model.train()": a validation pass sets eval()
    # and the loop never sets train() again. Signal: the dropout and BatchNorm modules are in
    # eval mode in the training forwards.
    model = nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def validate_once(step: int, m: nn.Module) -> None:
        if step == EVAL_AT + 1:
            m.eval()  # the bug: no m.train() after the validation pass
            with torch.no_grad():
                m(torch.randn(8, 16))

    _classify_loop(model, opt, steps, attach, at_step=validate_once)


EVAL_AT = 40


def batchnorm_batch_of_two(steps: int, attach: Attach) -> None:
    # Source: PyTorch forums "BatchNorm with batch size 1/2", the GroupNorm paper (Wu & He,
    # 2018). Signal: the BatchNorm layers see 2 samples a forward in training mode.
    model = BatchNormCNN()
    task = Patterns(shape=(1, 8, 8), noise=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(2)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)


def dropout_far_too_high(steps: int, attach: Attach) -> None:
    # Source: the report (Dropout(p=0.99) named "dead units, lower the lr"); p read as
    # the keep probability (Keras/TF1 keep_prob). Signal: a Dropout with p >= 0.8 in training.
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.95), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _classify_loop(model, opt, steps, attach)


def half_params_with_adam(steps: int, attach: Attach) -> None:
    # Source: PyTorch forums "Adam with half precision: NaNs / no training" (model.half() then
    # Adam, eps=1e-8 underflows). Signal: float16 parameters in an Adam param group.
    model = mlp(width=16, depth=2, out=4).half()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _classify_loop(
        model,
        opt,
        steps,
        attach,
        inputs=lambda x: x.half(),
        loss_of=lambda out, y: nn.functional.cross_entropy(out.float(), y),
    )


BROKEN = (
    Scenario("lr_too_high", "MLP", "SGD lr 1.0: the loss climbs 50x in a few steps",
             lr_too_high, 300, 80,
             ("lr_too_high", "loss_spike", "update_ratio_high", "exploding_gradients")),
    Scenario("lr_too_high_clipped", "MLP", "SGD lr 2.0 + momentum, clip_grad_norm_(1.0)",
             lr_too_high_clipped, 300, 120, ("lr_too_high", "exploding_gradients")),
    Scenario("adam_lr_too_high", "MLP", "Adam lr 1.0: the loss jumps 1e6x, then the ReLUs die",
             adam_lr_too_high, 300, 80, ("lr_too_high",)),
    Scenario("lr_to_nan", "MLP", "SGD lr 3.0: NaN within 10 steps", lr_to_nan, 100, 40,
             ("grad_non_finite", "loss_non_finite"), "0.weight"),
    Scenario("lr_spike_mid_run", "MLP", f"lr x100 from step {SPIKE_AT} (scheduler bug)",
             lr_spike_mid_run, 400, 260,
             ("loss_spike", "exploding_gradients", "grad_non_finite", "loss_non_finite",
              "lr_too_high"),
             None, SPIKE_AT),
    Scenario("lr_too_low", "MLP", "Adam lr 1e-9", lr_too_low, 300, 80,
             ("lr_too_low", "update_ratio_low")),
    Scenario("schedule_per_batch", "MLP", "ExponentialLR(0.9) stepped every batch",
             schedule_per_batch, 400, 200, ("lr_schedule_too_fast",), None, 66),
    Scenario("weight_decay_high", "MLP", "AdamW weight_decay=100", weight_decay_high, 300, 120,
             ("weight_decay_too_high",)),
    Scenario("adam_eps_huge", "MLP", "Adam eps=1e3: a dead optimizer, the loss stalls",
             adam_eps_huge, 400, 80, ("update_ratio_low", "loss_plateau"), "0.weight"),
    Scenario("explode_mid_run", "MLP", f"one input feature 1000x from step {EXPLODE_AT}",
             explode_mid_run, 400, 220, ("exploding_gradients", "inputs_not_normalised"),
             "0.weight", EXPLODE_AT),
    Scenario("grad_spike", "MLP",
             f"the gradient into Linear 2 x1000 at step {GRAD_SPIKE_AT + 1} only", grad_spike,
             300, 160, ("gradient_spike", "exploding_gradients", "loss_spike"), "2.weight",
             GRAD_SPIKE_AT),
    Scenario("grad_spike_clipped", "MLP",
             "the same spike, clip_grad_norm_(1.0) every step", grad_spike_clipped, 300, 160,
             ("gradient_spike",), "2.weight", GRAD_SPIKE_AT),
    Scenario("vanishing_sigmoid", "MLP", "24 sigmoid layers", vanishing_sigmoid, 200, 60,
             ("vanishing_gradients",), "0.weight"),
    Scenario("bad_init_small", "MLP", "8 ReLU layers initialised 1000x too small",
             bad_init_small, 200, 60, ("vanishing_gradients",), "0.weight"),
    Scenario("dead_relu", "MLP", "bias -50 before ReLU 3 (activations=True)", dead_relu, 200,
             60, ("dead_units",), "3"),
    Scenario("detached_branch", "two towers", ".detach() on the image tower", detached_branch,
             200, 30, ("gradient_not_flowing",), "image.weight"),
    Scenario("missing_from_optimizer", "MLP", "optimizer built without the head",
             missing_from_optimizer, 100, 20, ("params_not_in_optimizer",), "6.weight"),
    Scenario("frozen_in_optimizer", "MLP", "requires_grad=False layer in the optimizer",
             frozen_in_optimizer, 100, 20, ("frozen_params_in_optimizer",), "0.weight"),
    Scenario("lr_zero", "MLP", "SGD lr=0", lr_zero, 100, 20, ("lr_zero",), "0.weight"),
    Scenario("nan_batch", "MLP", f"a NaN in the input batch of step {NAN_AT + 1}", nan_batch,
             300, 130, ("grad_non_finite", "loss_non_finite"), "0.weight", NAN_AT),
    Scenario("log_zero", "MLP", f"0 * log(0) in a hand-written loss from step {LOG_ZERO_AT + 1}",
             log_zero, 300, 130, ("loss_non_finite", "grad_non_finite"), None, LOG_ZERO_AT),
    Scenario("fp16_overflow", "MLP", "fp16 autocast overflow, GradScaler skips every step",
             fp16_overflow, 200, 60, ("scaler_skipping",)),
    Scenario("labels_shuffled", "MLP", "labels shuffled within each batch", labels_shuffled,
             500, 300, ("labels_not_matching", "loss_plateau"), why_late=PLATEAU_LATE),
    Scenario("labels_misaligned", "MLP", "shuffled labels, a 10-way head on 4 classes",
             labels_misaligned, 500, 350, ("labels_not_matching",), why_late=PLATEAU_LATE),
    Scenario("clip_every_step", "MLP", "clip_grad_norm_(max_norm=1e-3)", clip_every_step, 300,
             80, ("clipping_active",)),
    Scenario("optimizer_for_loop", "many tensors", "Adam(foreach=False) over 200 tiny tensors",
             optimizer_for_loop, 400, 250, ("optimizer_share",), why_late=TIMING_LATE),
    Scenario("slow_data", "MLP", "a 10 ms batch decode in the loop", slow_data, 300, 200,
             ("input_bound",), why_late=TIMING_LATE),
    Scenario("optimizer_for_loop_busy", "many tensors",
             "optimizer_for_loop beside a busy process per core", optimizer_for_loop, 400, 250,
             ("optimizer_share",), why_late=TIMING_LATE, load=LOAD_PER_CORE),
    Scenario("slow_data_busy", "MLP", "slow_data beside a busy process per core", slow_data,
             300, 200, ("input_bound",), why_late=TIMING_LATE, load=LOAD_PER_CORE),
    Scenario("leaking_loop", "MLP", "each step's hidden features kept in a list (2 MiB a step)",
             leaking_loop, 300, 100, ("memory_leak",)),
    Scenario("lora_ab_zero", "LoRA", "LoRA A and B both initialised to zero", lora_ab_zero, 200,
             80, ("adapters_not_learning",), "2.b.weight"),
    Scenario("lora_checkpoint_cut", "LoRA",
             "reentrant checkpointing of a LoRA layer whose input does not require grad",
             lora_checkpoint_cut, 200, 80, ("adapters_not_learning",), "block.b.weight"),
    Scenario("lora_optimizer_before_adapters", "LoRA",
             "the optimizer built on the base, the adapters added after",
             lora_optimizer_before_adapters, 200, 40, ("adapters_not_trained",), "2.b.weight"),
    Scenario("lora_adapters_frozen", "LoRA", "adapters frozen (loaded without is_trainable)",
             lora_adapters_frozen, 200, 40, ("adapters_not_trained",), "0.a.weight"),
    Scenario("lora_base_unfrozen", "LoRA", "the base trains beside its adapters",
             lora_base_unfrozen, 200, 40, ("base_not_frozen",), "0.base.weight"),
    Scenario("lora_lr_tiny", "LoRA", "adapters with AdamW lr 1e-8", lora_lr_tiny, 200, 80,
             ("adapter_lr_too_small",), "0.a.weight"),
    Scenario("zero_grad_forgotten", "MLP", "optimizer.zero_grad() never called",
             zero_grad_forgotten, 200, 40, ("zero_grad_missing",)),
    Scenario("zero_grad_between", "MLP", "zero_grad() between backward() and step()",
             zero_grad_between_backward_and_step, 200, 40, ("zero_grad_after_backward",)),
    Scenario("step_before_backward", "MLP", "optimizer.step() before loss.backward()",
             step_before_backward, 200, 40, ("step_before_backward",)),
    Scenario("item_loss_rebuilt", "MLP",
             "backward on torch.tensor(loss.item(), requires_grad=True)",
             loss_rebuilt_from_item, 200, 40, ("loss_detached",)),
    Scenario("softmax_then_ce", "MLP", "nn.Softmax at the output, then cross_entropy",
             softmax_then_cross_entropy, 200, 40, ("softmax_before_cross_entropy",), "5"),
    Scenario("mse_sum_sgd", "MLP", "MSELoss(reduction='sum'), SGD lr tuned for the mean",
             mse_summed_with_sgd, 200, 40, ("loss_sum_reduction",)),
    Scenario("pixels_unscaled", "MLP", "inputs on a 0-255 scale", raw_pixels, 200, 40,
             ("inputs_not_normalised",), "0.weight"),
    Scenario("eval_left_on", "MLP", f"model.eval() for a validation pass at step {EVAL_AT + 1}, "
             "never train() again", eval_left_on, 200, 80, ("eval_mode_during_training",),
             None, EVAL_AT),
    Scenario("batchnorm_batch_2", "CNN", "BatchNorm CNN trained on batches of 2",
             batchnorm_batch_of_two, 200, 40, ("batchnorm_tiny_batch",), "bn1"),
    Scenario("dropout_095", "MLP", "Dropout(p=0.95)", dropout_far_too_high, 200, 40,
             ("dropout_too_high",), "2"),
    Scenario("adam_on_half_params", "MLP", "model.half() trained with Adam", half_params_with_adam,
             200, 40, ("fp16_params_with_adam",)),
)  # fmt: skip
