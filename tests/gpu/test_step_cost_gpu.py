"""On a real GPU: an unsampled step adds one fused norm, its stack and one copy of the norms and
the loss into pinned memory (three torch ops, one event), with no sync, and the numbers that
crossed are right: grad_norm is the norms' total and the loss is the one logged
(tests/capture/test_cost_counted.py counts the same path on the CPU)."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
import torch
from tests.gpu.sync_check import no_sync_allowed
from torch.utils._python_dispatch import TorchDispatchMode

import nbmonitor
from nbmonitor._capture.phases import DEVICE_EVERY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _loop(tmp: Any, monitored: bool) -> tuple[Any, Any, list[float], list[float]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[m for _ in range(4) for m in (torch.nn.Linear(64, 64), torch.nn.GELU())]
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device="cuda")
    mon = (
        nbmonitor.attach(model, opt, run_dir=tmp, display=False, interval=3600)
        if monitored
        else None
    )
    losses: list[torch.Tensor] = []
    totals: list[torch.Tensor] = []

    def step() -> None:
        loss = model(x).pow(2).mean()
        loss.backward()
        totals.append(
            torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in model.parameters()])
            ).detach()
        )
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mon is not None:
            mon.log(loss=loss)
        losses.append(loss.detach())

    return step, mon, losses, totals


def test_an_unsampled_cuda_step_adds_three_ops_one_copy_and_no_sync(tmp_path):
    counts = []
    for monitored in (False, True):
        step, mon, losses, totals = _loop(tmp_path / str(monitored), monitored)
        for _ in range(110):  # past the first steps' layer sampling
            step()
        per_step = []
        with no_sync_allowed():
            for _ in range(DEVICE_EVERY):
                with _Ops() as mode:
                    step()
                per_step.append(mode.ops)
        counts.append(per_step)
        if mon is not None:
            first = mon.step - DEVICE_EVERY + 1
            mon.flush()
            h = mon.history()
            mon.close()
    # The plain loop's ops include the test's own reference norms: compared step by step.
    for n, (plain, monitored) in enumerate(zip(*counts, strict=True), start=first):
        added = monitored - plain
        if n % DEVICE_EVERY:
            assert sum(added.values()) <= 3, (n, dict(added))
            assert added["aten.copy_"] + added["aten._to_copy"] <= 1, (n, dict(added))
    steps = h["step"].astype(int)
    want_loss = torch.stack(losses).cpu().numpy()
    want_total = torch.stack(totals).cpu().numpy()
    np.testing.assert_allclose(h["loss"], want_loss[steps - 1], rtol=1e-6)
    np.testing.assert_allclose(h["grad_norm"], want_total[steps - 1], rtol=1e-4)
