"""Held back. Healthy runs of other kinds and settings: each trains and must raise no alert."""

from __future__ import annotations

import warnings

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, SmallCNN, Teacher, TinyTransformer, reverse_batch
from tests.diagnosis.corpus._common import BNConvNet, LSTMClassifier, Trace, trained
from torch import nn


def train_classifier(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    task: Patterns,
    steps: int,
    attach: Attach,
    *,
    eval_every: int = 0,
    clip: float | None = None,
    sched: torch.optim.lr_scheduler.LRScheduler | None = None,
    batch: int = 32,
) -> Trace:
    t = Trace()
    mon = attach(model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        model.train()
        x, y = task.batch(batch)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
        if eval_every and step % eval_every == 0:
            model.eval()
            with torch.inference_mode():
                vx, vy = task.batch(256)
                t.rec(val=nn.functional.cross_entropy(model(vx), vy))
    return t


def cnn_bn_adam_evals(steps: int, attach: Attach) -> Trace:
    model = BNConvNet(bias=False)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    task = Patterns(shape=(1, 8, 8), noise=0.9, seed=111)
    return train_classifier(model, opt, task, steps, attach, eval_every=40)


def lstm_adamw_warmup(steps: int, attach: Attach) -> Trace:
    model = LSTMClassifier(hidden=24)
    opt = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))
    task = Patterns(shape=(6, 8), noise=0.8, seed=112)
    return train_classifier(model, opt, task, steps, attach, sched=sched, clip=5.0)


def transformer_adam_cosine(steps: int, attach: Attach) -> Trace:
    model = TinyTransformer(blocks=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=0.0)
    g, t = torch.Generator().manual_seed(113), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = reverse_batch(g)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def peft_lora_gpt2(steps: int, attach: Attach) -> Trace:
    # The real peft on a tiny GPT-2 built from a config (no download), LoRA on c_attn, c_fc
    # and c_proj, the model computing its own loss (``labels=``): count up by one, mod 16.
    # The base is initialised wide (initializer_range 0.3) to stand in for pretrained
    # weights: at GPT-2's 0.02 the frozen tied embedding caps the logits, nothing is learned.
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=16,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.3,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' config and init notices
        base = GPT2LMHeadModel(config)
        lora = LoraConfig(
            r=4,
            lora_alpha=16,
            target_modules=["c_attn", "c_fc", "c_proj"],
            lora_dropout=0.0,
            fan_in_fan_out=True,
        )
        model = get_peft_model(base, lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g, t = torch.Generator().manual_seed(114), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        start = torch.randint(0, 16, (16, 1), generator=g)
        ids = (start + torch.arange(10)) % 16
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def mlp_plain_sgd(steps: int, attach: Attach) -> Trace:
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    task, t = Teacher(seed=115), Trace()
    attach(model, opt, total_steps=steps)  # this user does not call mon.log
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
    return t


def mlp_dropout_half(steps: int, attach: Attach) -> Trace:
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train_classifier(model, opt, Patterns(noise=0.5, seed=116), steps, attach)


def cnn_bf16_sgd(steps: int, attach: Attach) -> Trace:
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    task, t = Patterns(shape=(1, 8, 8), seed=117), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def accumulate_8_adamw(steps: int, attach: Attach) -> Trace:
    model = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    task, t = Patterns(noise=0.6, seed=118), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        opt.zero_grad()
        total = 0.0
        for _ in range(8):
            x, y = task.batch(4)
            loss = nn.functional.cross_entropy(model(x), y) / 8
            loss.backward()
            total += float(loss.detach())
        nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
        t.rec(loss=total)
        mon.log(loss=total)
    return t


def long_bn_mlp_sgd(steps: int, attach: Attach) -> Trace:
    # A long run with BatchNorm1d on a normal batch (64), SGD momentum, step decay per
    # "epoch" of 500 steps.
    model = nn.Sequential(
        nn.Linear(16, 64),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Linear(64, 4),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    task, t = Patterns(noise=0.9, seed=119), Trace()
    mon = attach(model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        x, y = task.batch(64)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 500 == 0:
            sched.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def frozen_bn_batch_two(steps: int, attach: Attach) -> Trace:
    # Detection-style training (detectron's FrozenBatchNorm): batches of 2 images, every
    # BatchNorm frozen on purpose (eval(), no grad) so its statistics are not taken from 2
    # samples; the convs and head train.
    model = BNConvNet(bias=False)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.02, momentum=0.9)
    task, t = Patterns(shape=(1, 8, 8), noise=0.6, seed=120), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        model.train()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
        x, y = task.batch(2)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def mse_sum_scaled_lr(steps: int, attach: Attach) -> Trace:
    # A summed loss (reduction="sum") whose SGD lr was scaled by 1/batch to match: the same
    # updates as a mean with lr 0.05.
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05 / 64, momentum=0.9)
    task, t = Teacher(seed=121), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch(64)
        loss = nn.functional.mse_loss(model(x), y, reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def label_smoothing(steps: int, attach: Attach) -> Trace:
    # CrossEntropyLoss(label_smoothing=0.2): the loss cannot reach 0 by design.
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.2)
    task, t = Patterns(noise=0.5, seed=122), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = criterion(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def raw_features_bn_first(steps: int, attach: Attach) -> Trace:
    # Raw tabular columns (scale 10..1,000) whose first layer is a BatchNorm1d: the model
    # standardises its own input, a common tabular pattern.
    g = torch.Generator().manual_seed(123)
    scale = torch.logspace(1, 3, 12)
    w = torch.randn(12, 1, generator=g)
    model = nn.Sequential(nn.BatchNorm1d(12), nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    t = Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        z = torch.randn(64, 12, generator=g)
        y = torch.tanh(z @ w / 3)
        x = 5 * scale + z * scale
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def cosine_warm_restarts(steps: int, attach: Attach) -> Trace:
    # SGDR: CosineAnnealingWarmRestarts(T_0=50, eta_min=0) stepped per batch, as meant: the
    # lr falls to ~0 every 50 steps and restarts.
    model = nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=50, eta_min=0.0)
    return train_classifier(model, opt, Patterns(noise=0.6, seed=124), steps, attach, sched=sched)


# fmt: off
HEALTHY = (
    Scenario("hb_ok_cnn_bn_adam_evals", "healthy", "CNN + BatchNorm (no conv bias), Adam, "
             "inference_mode eval every 40", cnn_bn_adam_evals, 600, 240, check=trained(0.3)),
    Scenario("hb_ok_lstm_adamw_warmup", "healthy", "LSTM, AdamW, 30-step warm-up, clip 5",
             lstm_adamw_warmup, 600, 250, check=trained(0.3)),
    Scenario("hb_ok_transformer_cosine", "healthy", "1-block transformer, Adam, cosine to 0",
             transformer_adam_cosine, 800, 400, check=trained(0.5)),
    Scenario("hb_ok_peft_gpt2_tiny", "healthy", "peft LoRA on a tiny GPT-2 from a config",
             peft_lora_gpt2, 400, 120, check=trained(0.5)),
    Scenario("hb_ok_mlp_plain_sgd", "healthy", "tanh MLP, plain SGD lr 0.1, no momentum",
             mlp_plain_sgd, 800, 400, check=trained(0.5)),
    Scenario("hb_ok_mlp_dropout_05", "healthy", "MLP, Dropout(0.5), Adam", mlp_dropout_half,
             600, 250, check=trained(0.3)),
    Scenario("hb_ok_cnn_bf16_nesterov", "healthy", "CNN, bf16 autocast, SGD Nesterov",
             cnn_bf16_sgd, 600, 200, check=trained(0.3)),
    Scenario("hb_ok_accumulate_8_adamw", "healthy", "8 micro-batches of 4, AdamW, clip 2",
             accumulate_8_adamw, 600, 200, check=trained(0.3)),
    Scenario("hb_ok_frozen_bn_batch_2", "healthy",
             "CNN, batches of 2 with every BatchNorm frozen in eval() (FrozenBatchNorm style)",
             frozen_bn_batch_two, 600, 250, check=trained(0.5)),
    Scenario("hb_ok_mse_sum_lr_scaled", "healthy", "MSE reduction='sum', SGD lr scaled by 1/64",
             mse_sum_scaled_lr, 600, 250, check=trained(0.3)),
    Scenario("hb_ok_label_smoothing", "healthy", "CrossEntropyLoss(label_smoothing=0.2), AdamW",
             label_smoothing, 600, 200, check=trained(0.6)),
    Scenario("hb_ok_raw_features_bn_first", "healthy",
             "raw columns (10..1,000) into a BatchNorm1d first layer, Adam",
             raw_features_bn_first, 600, 250, check=trained(0.3)),
    Scenario("hb_ok_sgdr_warm_restarts", "healthy",
             "CosineAnnealingWarmRestarts(T_0=50, eta_min=0) per batch, SGD momentum",
             cosine_warm_restarts, 600, 250, check=trained(0.3)),
    Scenario("hb_ok_long_bn_mlp_sgd", "healthy", "BatchNorm1d MLP, batch 64, SGD, 2500 steps",
             long_bn_mlp_sgd, 5000, 2500, check=trained(0.3)),
)
# fmt: on
