"""On a real GPU: step phases are timed with CUDA events and spans with the host clock, and
neither synchronises."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from tests.gpu.sync_check import no_sync_allowed

import nbmonitor
from nbmonitor.records import PHASE_KEYS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_phases_and_spans_on_cuda_add_no_sync(tmp_path):
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(512, 2048, device="cuda")
    y = torch.randint(0, 10, (512,), device="cuda")

    def step(mon: nbmonitor.Monitor) -> None:
        with mon.span("data"):
            time.sleep(0.01)  # the GPU waits for this batch
        with mon.span("compute"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05) as mon:
        step(mon)
        with no_sync_allowed():
            for _ in range(30):
                step(mon)
        mon.flush()
        h = mon.history()
        errors = mon.errors
    assert errors == []
    phases = np.vstack([h[k][1:] for k in PHASE_KEYS])
    assert np.all(np.isfinite(phases)) and np.all(phases >= 0)
    # The device idled while the host slept: the data phase holds the sleep.
    assert np.median(h["phase_data_s"][1:]) >= 0.008
    assert np.median(h["phase_forward_s"][1:]) > 0 and np.median(h["phase_backward_s"][1:]) > 0
    # Device time and host time of a step agree on average (the device runs behind).
    total = phases.sum(axis=0)
    assert abs(np.median(total) - np.median(h["step_time"][1:])) < 0.25 * np.median(total)
    spans = nbmonitor.open(mon.run_dir).records("spans")
    assert {s["name"] for s in spans} == {"data", "compute"}
