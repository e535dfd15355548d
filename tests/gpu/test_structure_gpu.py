"""float16 autocast without a GradScaler on a real GPU: named as ``fp16_without_scaler``; with
a scaler, or with bfloat16, silent (the CPU tests cover the rule on its facts alone:
tests/health/test_structure_rules.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import nbmonitor

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def train(tmp: Path, dtype: torch.dtype, scaler: bool) -> list[str]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    amp = torch.amp.GradScaler("cuda") if scaler else None
    mon = nbmonitor.attach(model, opt, run_dir=tmp, display=False, interval=3600)
    try:
        for _ in range(40):
            x = torch.randn(32, 64, device="cuda")
            y = torch.randint(0, 10, (32,), device="cuda")
            opt.zero_grad()
            with torch.autocast("cuda", dtype=dtype):
                loss = nn.functional.cross_entropy(model(x), y)
            if amp is not None:
                amp.scale(loss).backward()
                amp.step(opt)
                amp.update()
            else:
                loss.backward()
                opt.step()
        mon.flush()
        return [a.rule for a in mon.events()]
    finally:
        mon.close()


def test_float16_autocast_without_a_scaler_is_named(tmp_path: Path) -> None:
    assert train(tmp_path, torch.float16, scaler=False).count("fp16_without_scaler") == 1


@pytest.mark.parametrize(("dtype", "scaler"), [(torch.float16, True), (torch.bfloat16, False)])
def test_a_scaler_or_bfloat16_is_silent(tmp_path: Path, dtype: torch.dtype, scaler: bool) -> None:
    assert "fp16_without_scaler" not in train(tmp_path, dtype, scaler)
