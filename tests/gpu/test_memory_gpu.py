"""Memory on a real GPU: the allocator's real key set, the process peak never reset, the
interval peak, and an out-of-memory error provoked on purpose (skipped without CUDA)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tests.backends.fake_allocator import KEYS

import nbmonitor
from nbmonitor.backends import CudaBackend, select

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_the_fake_allocator_has_the_real_key_set() -> None:
    torch.empty(1, device="cuda")
    assert set(torch.cuda.memory_stats(0)) == KEYS


def test_the_process_peak_is_never_reset_and_the_interval_peak_is_seen() -> None:
    model = torch.nn.Linear(64, 64).cuda()
    backend = select(model)
    assert isinstance(backend, CudaBackend)
    try:
        backend.sample()
        before = torch.cuda.memory_allocated(0)
        big = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
        del big
        peak = torch.cuda.max_memory_allocated(0)
        out = backend.sample()
        backend.sample()
        assert torch.cuda.max_memory_allocated(0) == peak  # the user's counter kept
        # This interval's peak, whatever an earlier test in the process reached.
        assert out["cuda_interval_peak_bytes"] == before + 64 * 2**20
        assert out["cuda_peak_allocated_bytes"] == peak
        assert out["cuda_total_bytes"] == torch.cuda.get_device_properties(0).total_memory
        assert out["cuda_inactive_split_bytes"] >= 0
    finally:
        backend.close()


def test_a_provoked_oom_is_counted_and_the_breakdown_is_on_the_device(tmp_path) -> None:
    model = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.Adam(model.parameters())
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05) as mon:
        for _ in range(2):
            model(torch.randn(32, 256, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
        total = torch.cuda.get_device_properties(0).total_memory
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(total * 2, dtype=torch.uint8, device="cuda")
        mon.flush()
        system = mon.system()
        got = mon.memory()
    assert system["cuda_ooms"][-1] >= 1
    assert not math.isnan(system["cuda_allocated_bytes"][-1])
    assert got.bytes("parameters", device="cuda:0") == (256 * 256 + 256) * 4
    # Adam's step counters stay on the CPU unless capturable or fused.
    assert got.bytes("optimizer_state", device="cuda:0") == 2 * (256 * 256 + 256) * 4


def test_memory_history_snapshot_and_the_oom_card_link(tmp_path) -> None:
    import pickle

    model = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.Adam(model.parameters())
    mon = nbmonitor.attach(
        model, opt, run_dir=tmp_path, display=False, interval=0.05, memory_history=True
    )
    try:
        model(torch.randn(32, 256, device="cuda")).sum().backward()
        opt.step()
        path = mon.memory_snapshot(tmp_path / "snap.pickle")
        with path.open("rb") as f:
            snapshot = pickle.load(f)
        assert snapshot["segments"] and snapshot["device_traces"]
        total = torch.cuda.get_device_properties(0).total_memory
        try:
            torch.empty(total * 2, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as exc:
            report = mon.oom_report(exc)
        assert report.snapshot is not None and Path(report.snapshot).exists()
    finally:
        mon.close()
