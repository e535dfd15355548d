"""The machine view (nbmonitor.devices(), nbmonitor top) on real NVML (skipped without CUDA)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_every_gpu_with_plausible_fields_and_this_process_listed() -> None:
    pynvml = pytest.importorskip("pynvml")
    from nbmonitor.backends.machine import MachineBackend

    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB of ours
    torch.cuda.synchronize()
    backend = MachineBackend()
    try:
        backend.sample()
        out = backend.sample()
        procs = backend.processes()
        gauges = backend.device_gauges(out)
        latency = backend.field_latency_us()
    finally:
        backend.close()
    print("\nnotes:", backend.notes)
    print("NVML call latency (mean µs):", {k: round(v, 1) for k, v in latency.items()})
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    assert len(backend.devices) == count == len(gauges) == len(procs)
    for i in range(count):
        assert 0 <= out[f"gpu{i}_util_percent"] <= 100
        assert 0 < out[f"gpu{i}_mem_used_bytes"] <= out[f"gpu{i}_mem_total_bytes"]
        assert 0 < out[f"gpu{i}_temperature_c"] < 120
        assert out[f"gpu{i}_power_w"] > 0 or math.isnan(out[f"gpu{i}_power_w"])
        assert out[f"gpu{i}_pcie_gen"] in (1, 2, 3, 4, 5, 6) or math.isnan(out[f"gpu{i}_pcie_gen"])
        assert gauges[i]["nvlink_links"] >= 0
    mine = [(i, p) for i, listed in enumerate(procs) for p in listed if p.pid == os.getpid()]
    assert mine, f"this process is on no GPU's list: {procs}"  # containers: host pids differ
    i, proc = mine[0]
    assert "python" in proc.name.lower() or "pytest" in proc.name.lower()
    assert proc.used_bytes >= x.numel()
    assert out[f"gpu{i}_process_mem_bytes"] == proc.used_bytes
    assert all(math.isfinite(out[k]) for k in ("cpu_percent", "ram_used_bytes"))
    del x


def test_devices_records_a_run_on_real_gpus(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    import nbmonitor

    watch = nbmonitor.devices(interval=0.2, run_dir=tmp_path)
    try:
        for _ in range(3):
            assert watch.flush()
        frame = watch.frame()
    finally:
        watch.close()
    assert watch.status == "closed" and not watch.errors, watch.errors
    assert len(frame.frame.devices) == len(watch.backend.devices) > 0
    run = nbmonitor.open(watch.run_dir)  # type: ignore[arg-type]
    system = run.system()
    assert len(system["time"]) >= 3
    assert math.isfinite(system["gpu0_mem_total_bytes"][-1])
