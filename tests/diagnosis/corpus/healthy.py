"""Healthy runs of varied kinds: each trains (its loss falls well below its start) and must
raise no alert."""

from __future__ import annotations

import math

import torch
from benchmarks.diagnosis.harness import Attach, Scenario
from benchmarks.diagnosis.models import Patterns, Teacher, TinyTransformer, mlp, reverse_batch
from tests.diagnosis.corpus._common import (
    BNConvNet,
    GRUClassifier,
    LSTMClassifier,
    Trace,
    pretrained_base,
    trained,
    with_lora,
)
from tests.diagnosis.corpus.finetune import finetune_loop, lora_b, tiny_peft
from torch import nn


def classify(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    task: Patterns,
    steps: int,
    attach: Attach,
    *,
    batch: int = 32,
    sched: torch.optim.lr_scheduler.LRScheduler | None = None,
    clip: float | None = None,
    eval_every: int = 0,
) -> Trace:
    t = Trace()
    mon = attach(model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        x, y = task.batch(batch)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
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
            with torch.no_grad():
                vx, vy = task.batch(128)
                t.rec(val=nn.functional.cross_entropy(model(vx), vy))
            model.train()
    return t


def mlp_dropout_eval_passes(steps: int, attach: Attach) -> Trace:
    # Dropout 0.3, AdamW, an evaluation pass every 50 steps (eval() + no_grad, then train()).
    model = nn.Sequential(
        nn.Linear(16, 64),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Linear(64, 4),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return classify(model, opt, Patterns(), steps, attach, eval_every=50)


def cnn_conv_bias_bn(steps: int, attach: Attach) -> Trace:
    # A conv with its bias right before BatchNorm (the bias gets a zero gradient by
    # construction), SGD momentum, batch 32.
    model = BNConvNet(bias=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return classify(model, opt, Patterns(shape=(1, 8, 8), noise=0.8), steps, attach)


def gru_adam_clipped(steps: int, attach: Attach) -> Trace:
    model = GRUClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return classify(model, opt, Patterns(shape=(6, 8), noise=0.8), steps, attach, clip=1.0)


def lstm_steplr_per_epoch(steps: int, attach: Attach) -> Trace:
    # StepLR stepped once per epoch of 25 batches, as meant.
    model = LSTMClassifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    task, t = Patterns(shape=(6, 8), noise=0.8), Trace()
    mon = attach(model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            sched.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def transformer_onecycle(steps: int, attach: Attach) -> Trace:
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    g, t = torch.Generator().manual_seed(11), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = reverse_batch(g)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def lora_by_hand(steps: int, attach: Attach) -> Trace:
    model = with_lora(pretrained_base())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return finetune_loop(model, opt, steps, attach, model.fc2.lora_B)  # type: ignore[arg-type]


def peft_lora(steps: int, attach: Attach) -> Trace:
    model = tiny_peft()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return finetune_loop(model, opt, steps, attach, lora_b(model))


def grad_accumulation(steps: int, attach: Attach) -> Trace:
    # 4 micro-batches a step, each loss / 4, zero_grad after the step.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    task, t = Teacher(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        total = 0.0
        for _ in range(4):
            x, y = task.batch(8)
            loss = nn.functional.mse_loss(model(x), y) / 4
            loss.backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad()
        t.rec(loss=total)
        mon.log(loss=total)
    return t


def bf16_autocast_cpu(steps: int, attach: Attach) -> Trace:
    model = mlp(width=16, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    task, t = Patterns(), Trace()
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


def overfit_one_batch(steps: int, attach: Attach) -> Trace:
    # Karpathy's recipe, "overfit one batch": the same 16 samples every step, loss to ~0.
    model = mlp(width=16, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = Patterns(noise=1.5).batch(16)
    t = Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def long_warmup_cosine(steps: int, attach: Attach) -> Trace:
    # A long run: AdamW, linear warm-up over 100 steps, cosine to ~0 at the end.
    model = mlp(width=16, depth=3)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)

    def factor(step: int) -> float:
        if step < 100:
            return (step + 1) / 100
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - 100) / (steps - 100))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    task, t = Teacher(), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, y = task.batch()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def first_layers_frozen(steps: int, attach: Attach) -> Trace:
    # Transfer-learning style: the first two Linear layers frozen on purpose (no adapters),
    # the optimizer holds only what trains.
    model = mlp(width=16, depth=3, out=4)
    for p in [*model[0].parameters(), *model[2].parameters()]:
        p.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    return classify(model, opt, Patterns(), steps, attach)


def frozen_backbone_in_eval(steps: int, attach: Attach) -> Trace:
    # Transfer learning as the tutorials do it: a "pretrained" conv backbone with BatchNorm,
    # frozen and kept in eval() (its running statistics fixed), only a new head trains.
    backbone = BNConvNet(bias=False)
    backbone.head = nn.Identity()  # type: ignore[assignment]
    head = nn.Linear(16 * 2 * 2, 4)
    model = nn.Sequential(backbone, head)
    backbone.requires_grad_(False)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    task, t = Patterns(shape=(1, 8, 8), noise=0.6, seed=12), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        model.train()
        backbone.eval()  # on purpose: frozen statistics
        x, y = task.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


class TinyVAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(16, 32)
        self.mu = nn.Linear(32, 4)
        self.logvar = nn.Linear(32, 4)
        self.dec = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = torch.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


def vae_sum_reduction_adam(steps: int, attach: Attach) -> Trace:
    # pytorch/examples' VAE: the reconstruction loss summed over the batch
    # (reduction="sum") plus the KL term, with Adam (scale-free: the sum is fine here).
    model = TinyVAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, t = Patterns(noise=0.3, seed=13), Trace()
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        x, _ = task.batch(64)
        recon, mu, logvar = model(x)
        rec = nn.functional.mse_loss(recon, x, reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss = rec + kld
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


class BagClassifier(nn.Module):
    def __init__(self, vocab: int = 5000) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, 16, mode="mean")
        self.head = nn.Linear(16, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def embedding_large_vocab(steps: int, attach: Attach) -> Trace:
    # Token ids up to 5,000 (integers, not features to normalise) into an EmbeddingBag.
    g, t = torch.Generator().manual_seed(14), Trace()
    keys = torch.randint(0, 5000, (4, 3), generator=g)  # three marker tokens per class
    model = BagClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    mon = attach(model, opt, total_steps=steps)
    for _ in range(steps):
        y = torch.randint(0, 4, (32,), generator=g)
        noise = torch.randint(0, 5000, (32, 9), generator=g)
        tokens = torch.cat([keys[y], noise], dim=1)
        loss = nn.functional.cross_entropy(model(tokens), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.rec(loss=loss)
        mon.log(loss=loss)
    return t


def linear_warmup_from_zero(steps: int, attach: Attach) -> Trace:
    # transformers' get_linear_schedule_with_warmup, written out: the lr is exactly 0 on the
    # first step, rises over 50 steps and decays linearly to exactly 0 on the last.
    model = mlp(width=16, out=4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warmup = 50

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        return max(0.0, (steps - step) / (steps - warmup))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    return classify(model, opt, Patterns(seed=15), steps, attach, sched=sched)


# fmt: off
HEALTHY = (
    Scenario("ok_mlp_dropout_eval", "healthy", "MLP, dropout 0.3, AdamW, eval pass every 50",
             mlp_dropout_eval_passes, 600, 300, check=trained(0.3)),
    Scenario("ok_cnn_convbias_bn", "healthy", "CNN, conv bias before BatchNorm2d, SGD momentum",
             cnn_conv_bias_bn, 600, 200, check=trained(0.3)),
    Scenario("ok_gru_adam_clip", "healthy", "GRU classifier, Adam, clip 1.0", gru_adam_clipped,
             600, 250, check=trained(0.3)),
    Scenario("ok_lstm_steplr_epochs", "healthy", "LSTM, SGD momentum, StepLR per epoch",
             lstm_steplr_per_epoch, 600, 250, check=trained(0.3)),
    Scenario("ok_transformer_onecycle", "healthy", "2-block transformer, AdamW OneCycle, clip",
             transformer_onecycle, 800, 400, check=trained(0.5)),
    Scenario("ok_lora_hand", "healthy", "hand LoRA on a frozen base, AdamW", lora_by_hand,
             600, 200, check=trained(0.5)),
    Scenario("ok_peft_lora", "healthy", "peft LoRA on a frozen base, AdamW", peft_lora, 600,
             200, check=trained(0.5)),
    Scenario("ok_grad_accum_4", "healthy", "4 micro-batches a step, zero_grad after step",
             grad_accumulation, 600, 250, check=trained(0.5)),
    Scenario("ok_bf16_autocast_cpu", "healthy", "bf16 autocast on CPU, Adam", bf16_autocast_cpu,
             600, 200, check=trained(0.3)),
    Scenario("ok_overfit_one_batch", "healthy", "overfit one batch of 16 on purpose",
             overfit_one_batch, 600, 300, check=trained(0.05)),
    Scenario("ok_long_warmup_cosine", "healthy", "AdamW warm-up + cosine to 0, 2000 steps",
             long_warmup_cosine, 4000, 2000, check=trained(0.3)),
    Scenario("ok_frozen_backbone_eval", "healthy",
             "frozen BatchNorm backbone kept in eval(), a new head trains",
             frozen_backbone_in_eval, 600, 200, check=trained(0.5)),
    Scenario("ok_vae_sum_reduction_adam", "healthy",
             "VAE, reconstruction summed (reduction='sum') + KL, Adam (pytorch/examples)",
             vae_sum_reduction_adam, 600, 300, check=trained(0.6)),
    Scenario("ok_embedding_vocab_5000", "healthy", "EmbeddingBag over token ids up to 5,000",
             embedding_large_vocab, 600, 250, check=trained(0.3)),
    Scenario("ok_linear_warmup_from_0", "healthy",
             "lr exactly 0 at the first step, warm-up, linear decay to exactly 0 (HF style)",
             linear_warmup_from_zero, 600, 250, check=trained(0.3)),
    Scenario("ok_first_layers_frozen", "healthy", "first two Linear frozen on purpose, Adam",
             first_layers_frozen, 600, 250, check=trained(0.5)),
)
# fmt: on
