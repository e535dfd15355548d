"""What the corpus's runs share: the numbers a run keeps of itself (``Trace``), the checks
on them, and a few tiny models and tasks beyond ``benchmarks.diagnosis.models``.

A run's own numbers are what the user could print in the loop (the loss, the lr, a weight's
norm); a scenario's ``check`` judges its bug (or, healthy, its training) from them alone,
never from the monitor's alerts.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


class Trace(dict[str, list[float]]):
    """Per-step numbers a loop keeps of itself: ``trace.rec(loss=loss, lr=lr)``."""

    def rec(self, **values: float | torch.Tensor) -> None:
        for key, value in values.items():
            number = float(value.detach().float().cpu()) if torch.is_tensor(value) else value
            self.setdefault(key, []).append(float(number))

    def first(self, key: str, n: int = 5) -> float:
        values = self[key][:n]
        return sum(values) / len(values)

    def last(self, key: str, n: int = 20) -> float:
        values = self[key][-n:]
        return sum(values) / len(values)

    def finite(self, key: str) -> bool:
        return all(math.isfinite(v) for v in self[key])


Check = Callable[[Trace], str]


def need(ok: bool, what: str) -> str:
    """ "" when ``ok``, else ``what`` (the signal the run did not show)."""
    return "" if ok else what


def trained(ratio: float = 0.5, key: str = "loss") -> Check:
    """A healthy run trained: its last losses are below ``ratio`` x its first ones."""

    def check(t: Trace) -> str:
        start, end = t.first(key), t.last(key)
        return need(
            t.finite(key) and end < ratio * start,
            f"did not train: {key} {start:.3g} -> {end:.3g} (wanted < {ratio} x start)",
        )

    return check


def stalls(ratio: float = 0.8, key: str = "loss") -> Check:
    """The loss does not come down: the last losses stay above ``ratio`` x the first ones
    (or turn non-finite)."""

    def check(t: Trace) -> str:
        start, end = t.first(key), t.last(key)
        return need(
            not math.isfinite(end) or end > ratio * start,
            f"the loss came down ({start:.3g} -> {end:.3g}): the bug did not bite",
        )

    return check


def param_norm(module: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return torch.sqrt(sum((p.float() ** 2).sum() for p in module.parameters()))


def grad_norm(params: object) -> float:
    """The total gradient norm the loop would print (0 when no parameter has a gradient)."""
    grads = [p.grad for p in params if p.grad is not None]  # type: ignore[attr-defined]
    if not grads:
        return 0.0
    return float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads)))


class GRUClassifier(nn.Module):
    """A sequence (B, T, F) -> GRU -> the last hidden state -> a Linear head."""

    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class LSTMClassifier(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class BNConvNet(nn.Module):
    """Conv (with its bias, as user code often has it) -> BatchNorm2d -> ReLU, twice, on
    1x8x8 images; the conv bias gets a zero gradient through the BatchNorm by construction."""

    def __init__(self, classes: int = 4, bias: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=bias)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=bias)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16 * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.head(x.flatten(1))


class TinyBase(nn.Module):
    """A small 'pretrained' classifier for adapters: named Linear layers peft can target."""

    def __init__(self, width: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def pretrained_base(seed: int = 5) -> TinyBase:
    """A TinyBase with weights standing in for a pretrained checkpoint (fixed by seed)."""
    g = torch.Generator().manual_seed(seed)
    base = TinyBase()
    with torch.no_grad():
        for p in base.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return base


class LoRA(nn.Module):
    """A hand-written LoRA around a Linear, as user code writes it: ``x W^T + s * B A x``."""

    def __init__(
        self, base: nn.Linear, rank: int = 4, alpha: float = 8.0, freeze: bool = True
    ) -> None:
        super().__init__()
        self.base = base
        if freeze:
            base.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * (x @ self.lora_A.T @ self.lora_B.T)


def with_lora(base: TinyBase, freeze: bool = True) -> TinyBase:
    """fc1 and fc2 of ``base`` wrapped in LoRA (the head stays as it is)."""
    base.fc1 = LoRA(base.fc1, freeze=freeze)  # type: ignore[assignment]
    base.fc2 = LoRA(base.fc2, freeze=freeze)  # type: ignore[assignment]
    if freeze:
        base.out.requires_grad_(False)
    return base


def adapter_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for n, p in model.named_parameters() if "lora_" in n]
