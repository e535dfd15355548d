"""On a real GPU: nbmonitor's hooks and log() add no host-device synchronisation."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from tests.gpu.sync_check import no_sync_allowed

import nbmonitor

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 10),
    ).cuda()


@pytest.mark.parametrize("layer_every", [0, 1, 10])
def test_monitored_loop_adds_no_sync(tmp_path, layer_every):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")

    def step(mon: nbmonitor.Monitor) -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.log(loss=loss)

    with nbmonitor.attach(
        model, opt, run_dir=tmp_path, display=False, interval=0.05, layer_every=layer_every
    ) as mon:
        step(mon)  # first step allocates optimizer state outside the sync check
        with no_sync_allowed():
            for _ in range(50):
                step(mon)
        assert mon.backend.name == "cuda"
        time.sleep(0.3)
    mon.flush()
    h = mon.history()
    assert len(h["step"]) == 51
    assert np.all(np.isfinite(h["loss"])) and np.all(np.isfinite(h["grad_norm"]))
    assert mon.errors == []


def test_nvml_fields_plausible_during_training(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device="cuda")
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.1) as mon:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        s = mon.system()
    assert s["gpu0_mem_total_bytes"][-1] > 1e9
    assert 0 <= s["gpu0_util_percent"][-1] <= 100
    t = s["gpu0_temperature_c"][-1]
    assert math.isnan(t) or 10 <= t <= 110
    assert s["cuda_allocated_bytes"][-1] > 0
    nan_fields = sorted(k for k, v in s.items() if np.all(np.isnan(v)))
    print("NaN fields:", nan_fields)
    print("NVML latency (us):", mon.backend.field_latency_us())  # type: ignore[attr-defined]
