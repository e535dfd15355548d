"""Tiny CPU models and data for the diagnosis scenarios: each trains in well under a second
per thousand steps, and a healthy one converges."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


def mlp(
    width: int = 16, depth: int = 3, act: Callable[[], nn.Module] = nn.ReLU, out: int = 1
) -> nn.Sequential:
    """``depth`` x (Linear, act), then a Linear head: module names 0, 1, ..., 2 * depth."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), act()]
    return nn.Sequential(*layers, nn.Linear(width, out))


class Teacher:
    """A fixed regression task: y = a small random MLP of x, on a fixed data set."""

    def __init__(self, width: int = 16, n: int = 256, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, width, generator=g)
        w1 = torch.randn(width, 8, generator=g) / math.sqrt(width)
        w2 = torch.randn(8, 1, generator=g) / math.sqrt(8)
        self.y = torch.tanh(self.x @ w1) @ w2
        self.g = torch.Generator().manual_seed(seed + 1)

    def batch(self, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.randint(0, self.x.shape[0], (size,), generator=self.g)
        return self.x[i], self.y[i]


class Patterns:
    """A fixed classification task: ``classes`` noisy templates of ``shape``."""

    def __init__(
        self, classes: int = 4, shape: tuple[int, ...] = (16,), noise: float = 0.3, seed: int = 2
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.templates = torch.randn(classes, *shape, generator=g)
        self.classes, self.noise = classes, noise
        self.g = torch.Generator().manual_seed(seed + 1)

    def batch(self, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, self.classes, (size,), generator=self.g)
        x = self.templates[y] + self.noise * torch.randn(
            size, *self.templates.shape[1:], generator=self.g
        )
        return x, y


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


class Block(nn.Module):
    def __init__(self, d: int, heads: int = 2) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    """Token classification: predict the sequence reversed (needs attention)."""

    def __init__(self, vocab: int = 8, d: int = 32, length: int = 6, blocks: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.1 * torch.randn(length, d))
        self.blocks = nn.Sequential(*[Block(d) for _ in range(blocks)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(tokens) + self.pos)))


def reverse_batch(
    g: torch.Generator, size: int = 32, vocab: int = 8, length: int = 6
) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, vocab, (size, length), generator=g)
    return x, x.flip(1)


class LoRALinear(nn.Module):
    """A frozen base Linear plus a trainable low-rank update (B starts at zero); ``dropout`` on
    the update's input, as LoRA configs have it."""

    def __init__(self, base: nn.Linear, rank: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Linear(base.in_features, rank, bias=False)
        self.b = nn.Linear(rank, base.out_features, bias=False)
        self.dropout = nn.Dropout(dropout)
        nn.init.zeros_(self.b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.b(self.a(self.dropout(x)))


class LoRATask:
    """A fine-tuning task: a base MLP (32 -> 32 -> 32) and a target 0.05 away from it, which
    rank-4 adapters on both layers can reach."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.base = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
        self.target = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
        with torch.no_grad():
            for p, q in zip(self.target.parameters(), self.base.parameters(), strict=True):
                p.copy_(q + 0.05 * torch.randn_like(q))
        self.g = torch.Generator().manual_seed(seed + 4)

    def model(self, dropout: float = 0.0) -> nn.Sequential:
        """The base with LoRA on both Linears (``0`` and ``2``)."""
        return nn.Sequential(
            LoRALinear(self.base[0], dropout=dropout),
            nn.ReLU(),
            LoRALinear(self.base[2], dropout=dropout),
        )

    def batch(self, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(size, 32, generator=self.g)
        with torch.no_grad():
            return x, self.target(x)


class ResidualTanh(nn.Module):
    """A deep stack of pre-norm residual tanh blocks: deep, yet gradients flow."""

    def __init__(self, width: int = 16, depth: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.Tanh())
            for _ in range(depth)
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class TwoTower(nn.Module):
    """Two towers feeding one head; ``detach`` cuts the image tower out of backward."""

    def __init__(self, detach: bool) -> None:
        super().__init__()
        self.text = nn.Linear(16, 8)
        self.image = nn.Linear(16, 8)
        self.head = nn.Linear(16, 1)
        self.detach = detach

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        image = self.image(x)
        if self.detach:
            image = image.detach()  # the bug
        return self.head(torch.cat([self.text(x), image], dim=1))


def cosine_warmup(
    optimizer: torch.optim.Optimizer, warmup: int, total: int
) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class ManyRows(nn.Module):
    """``n`` tiny parameter tensors (rows of a linear map) that the forward stacks in one call:
    forward and backward are cheap, a for-loop optimizer spends its step on Python."""

    def __init__(self, n: int = 200, width: int = 4) -> None:
        super().__init__()
        self.rows = nn.ParameterList(nn.Parameter(torch.randn(width) * 0.1) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.stack(tuple(self.rows)).T


class BatchNormCNN(nn.Module):
    """Conv layers with a bias, each followed by BatchNorm (as much user code writes them: the
    bias's gradient is zero by construction, BatchNorm subtracts the batch mean)."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16 * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.head(x.flatten(1))
