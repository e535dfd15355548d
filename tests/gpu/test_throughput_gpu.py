"""Tokens/s, FLOPs, MFU and the profiler on a real CUDA device (skipped without one)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.tiny_lm import TinyLM
from torch.utils.flop_counter import FlopCounterMode

import nbmonitor
from nbmonitor._engine.derive.mfu import device_key

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def step(model: TinyLM, opt: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_mfu_on_the_gpu_in_bfloat16(tmp_path: Path) -> None:
    model = TinyLM(vocab=512, width=256, layers=2, heads=4).cuda()
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 512, (8, 128), device="cuda")
    with FlopCounterMode(display=False) as counter:  # forward and backward, torch's own count
        step(model, opt, ids)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(5):
            step(model, opt, ids)
        mon.flush()
        h = mon.history()
        notes = mon.frame(detail=False).notes
    assert h["tokens"][-1] == 8 * 128
    assert h["flops_per_step"][-1] == pytest.approx(counter.get_total_flops(), rel=0.05)
    assert all(v > 0 for v in h["tflops_per_s"])
    name = torch.cuda.get_device_name()
    if device_key(name) is not None:
        assert "mfu" not in notes
        assert 0 < h["mfu_percent"][-1] < 100
    else:
        assert math.isnan(h["mfu_percent"][-1]) and name in notes["mfu"]


def test_profile_records_cuda_activity(tmp_path: Path) -> None:
    model = TinyLM(vocab=512, width=256).cuda()
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 512, (8, 128), device="cuda")
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        prof = mon.profile(steps=2, wait=0, warmup=1)
        for _ in range(5):
            step(model, opt, ids)
        assert prof.wait(60) and prof.error is None
    rows = prof.rows
    assert any(row["self_device_ms"] > 0 for row in rows)
    device_ms = [row["self_device_ms"] for row in rows]
    assert device_ms == sorted(device_ms, reverse=True)  # costliest on the device first
    assert not torch.autograd._profiler_enabled()
