"""grad_norm is the norm before clipping: per step it equals what torch.nn.utils.clip_grad_norm_
returned, in the loops people train with (nanoGPT-style accumulation and cosine LR, bf16
autocast, GradScaler), and a spike that the clip hides from the optimizer still shows."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch

import nbmonitor
from nbmonitor._capture import intercept

ACCUMULATE = 2
MAX_NORM = 1.0
VOCAB, WIDTH, BLOCK = 32, 16, 8


class TinyGPT(torch.nn.Module):
    """Embeddings, one pre-norm MLP block with a residual and a head: a nanoGPT in miniature."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, WIDTH)
        self.wpe = torch.nn.Embedding(BLOCK, WIDTH)
        self.ln = torch.nn.LayerNorm(WIDTH)
        self.fc = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.proj = torch.nn.Linear(4 * WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        x = x + self.proj(torch.nn.functional.gelu(self.fc(self.ln(x))))
        logits = self.head(x)
        return torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def cosine_lr(it: int, steps: int, lr: float = 1e-2, warmup: int = 2) -> float:
    if it < warmup:
        return lr * (it + 1) / warmup
    ratio = (it - warmup) / max(1, steps - warmup)
    return 0.1 * lr + 0.5 * (1 + math.cos(math.pi * ratio)) * 0.9 * lr


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, VOCAB, (4, BLOCK), generator=gen)
    return idx, torch.roll(idx, -1, dims=1)


def run(
    tmp_path: Path,
    steps: int = 8,
    *,
    clip: bool = True,
    autocast: Callable[[], AbstractContextManager[object]] = nullcontext,
    scaler: torch.amp.GradScaler | None = None,
    loss_scale: Callable[[int], float] = lambda it: 1.0,
    poison_at: int | None = None,
    check_every_step: bool = False,
) -> tuple[nbmonitor.Monitor, list[float], list[dict[str, float]]]:
    """A nanoGPT-style loop; returns the monitor (flushed, closed), what clip_grad_norm_
    returned per step, and each step's per-parameter norms just before the clip."""
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False)
    gen = torch.Generator().manual_seed(1)
    returned: list[float] = []
    before: list[dict[str, float]] = []
    for it in range(steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(it, steps)
        for _ in range(ACCUMULATE):
            idx, targets = batch(gen)
            with autocast():
                loss = model(idx, targets) * loss_scale(it) / ACCUMULATE
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            if it == poison_at:
                model.fc.weight.grad[0, 0] = math.inf  # type: ignore[index]
            scaler.unscale_(opt)
        if clip:
            before.append(
                {n: float(p.grad.norm()) for n, p in model.named_parameters() if p.grad is not None}
            )
            returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        mon.log(loss=loss * ACCUMULATE)
        if check_every_step:
            mon.flush()  # the health rules judge each step as it comes (as a slow loop's are)
    mon.flush()
    mon.close()
    return mon, returned, before


def assert_close(got: np.ndarray, want: list[float]) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_grad_norm_is_what_clip_grad_norm_returned(tmp_path: Path) -> None:
    # Gradients a few times larger than the tiny model's own, so that the clip acts.
    mon, returned, before = run(tmp_path, loss_scale=lambda it: 3.0)
    h = mon.history()
    assert h["step"].tolist() == list(range(1, 9))
    assert max(returned) > MAX_NORM  # the clip did scale some steps
    assert_close(h["grad_norm"], returned)
    want = [min(1.0, MAX_NORM / (n + 1e-6)) for n in returned]
    assert_close(h["grad_clip_coef"], want)
    # Per-layer norms are pre-clip too (the last step's, as layers() shows them).
    layers = {row["name"]: row["grad_norm"] for row in mon.layers()}
    for name, norm in before[-1].items():
        assert layers[name] == pytest.approx(norm, rel=1e-4)
    assert intercept.listening() == 0
    assert torch.nn.utils.clip_grad_norm_ is intercept._ORIGINAL_CLIP


def test_bf16_autocast(tmp_path: Path) -> None:
    def autocast() -> AbstractContextManager[object]:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    mon, returned, _ = run(tmp_path, autocast=autocast)
    assert_close(mon.history()["grad_norm"], returned)


def test_grad_scaler_unscaled_norms_and_a_skipped_step(tmp_path: Path) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    mon, returned, _ = run(tmp_path, scaler=scaler, poison_at=4)
    h = mon.history()
    assert h["step"].tolist() == list(range(1, 9))  # the skipped step counts, as the loop's does
    skipped = np.nan_to_num(h["step_skipped"]).tolist()
    assert skipped == [0, 0, 0, 0, 1, 0, 0, 0]
    assert not math.isfinite(returned[4])
    kept = [i for i in range(8) if i != 4]
    assert_close(h["grad_norm"][kept], [returned[i] for i in kept])  # unscaled, pre-clip
    assert math.isnan(h["grad_norm"][4])
    rules = {a.rule for a in mon.events()}
    assert "exploding_gradients" not in rules
    assert "grad_non_finite" not in rules


def test_a_loop_without_clipping_is_unchanged(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False)
    gen = torch.Generator().manual_seed(1)
    norms = []
    for _ in range(4):
        model(*batch(gen)).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
        opt.step()
        opt.zero_grad()
    mon.flush()
    mon.close()
    h = mon.history()
    assert_close(h["grad_norm"], norms)
    assert "grad_clip_coef" not in h or np.isnan(h["grad_clip_coef"]).all()


def test_a_spike_shows_through_the_clip_and_raises_the_alert(tmp_path: Path) -> None:
    # sustain_steps (3) steps long, once the run is a full window (100 steps) old.
    spike = range(104, 107)
    mon, returned, _ = run(
        tmp_path,
        steps=112,
        loss_scale=lambda it: 1e4 if it in spike else 1.0,
        check_every_step=True,
    )
    h = mon.history()
    assert_close(h["grad_norm"], returned)
    assert h["grad_norm"][104] > 100 * MAX_NORM  # not flat at max_norm
    assert h["grad_clip_coef"][104] < 0.01
    alerts = [a for a in mon.events() if a.rule == "exploding_gradients"]
    # The pre-clip norm is what explodes: said at the spike's first step, for the total alone
    # or with the layers it rose in (one alert when both hold at the same check).
    assert any(a.subject in ("grad_norm", "layers") and a.step == 105 for a in alerts), alerts


def test_another_models_clip_is_not_this_steps(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, other = TinyGPT(), TinyGPT()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False)
    gen = torch.Generator().manual_seed(1)
    model(*batch(gen)).backward()
    other(*batch(gen)).backward()
    torch.nn.utils.clip_grad_norm_(other.parameters(), MAX_NORM)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    opt.step()
    mon.flush()
    mon.close()
    h = mon.history()
    assert_close(h["grad_norm"], [norm])
    assert "grad_clip_coef" not in h or np.isnan(h["grad_clip_coef"]).all()


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_a_compiled_model(tmp_path: Path) -> None:
    # Warnings are errors: a root hook that dynamo tried to trace would fail this test.
    torch.manual_seed(0)
    model = TinyGPT()
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False)
    gen = torch.Generator().manual_seed(1)
    returned = []
    for _ in range(3):
        for _ in range(ACCUMULATE):
            (compiled(*batch(gen)) * 3 / ACCUMULATE).backward()
        returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        opt.step()
        opt.zero_grad()
    mon.flush()
    mon.close()
    h = mon.history()
    assert h["micro_batches"].tolist() == [ACCUMULATE] * 3
    assert_close(h["grad_norm"], returned)
