"""The CUDA backend against a real GPU and driver (skipped where CUDA is unavailable)."""

from __future__ import annotations

import math

import pytest
import torch

from nbmonitor.backends import CudaBackend, select
from nbmonitor.backends.cuda import ALLOCATOR_KEYS, GPU_FIELDS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def between(value: float, low: float, high: float) -> bool:
    return low <= value <= high


def test_real_sample_has_every_key_with_plausible_values() -> None:
    model = torch.nn.Linear(256, 256).cuda()
    backend = select(model)
    assert isinstance(backend, CudaBackend), backend
    try:
        first = backend.sample()
        x = torch.randn(1024, 256, device="cuda")
        for _ in range(20):
            model(x).sum().backward()
        torch.cuda.synchronize()
        out = backend.sample()
    finally:
        backend.close()
    print("\nnotes:", backend.notes)
    print("NVML call latency (mean µs):")
    for name, us in sorted(backend.field_latency_us().items(), key=lambda kv: -kv[1]):
        print(f"  {name:<14} {us:10.1f}")
    assert set(out) == set(backend.keys) == set(first)
    assert backend.devices and all(backend.devices)
    for i in range(backend.gpu_count):
        g = {f: out[f"gpu{i}_{f}"] for f in GPU_FIELDS}
        print(f"gpu{i}:", g)
        assert between(g["util_percent"], 0, 100)
        assert between(g["mem_util_percent"], 0, 100)
        assert g["mem_total_bytes"] > 0
        assert between(g["mem_used_bytes"], 0, g["mem_total_bytes"])
        assert math.isnan(g["temperature_c"]) or between(g["temperature_c"], 10, 110)
        assert math.isnan(g["power_w"]) or between(g["power_w"], 1, 2000)
        assert math.isnan(g["power_limit_w"]) or between(g["power_limit_w"], 10, 2000)
        assert math.isnan(g["energy_j"]) or g["energy_j"] >= 0
        assert math.isnan(g["sm_clock_mhz"]) or between(g["sm_clock_mhz"], 0, 5000)
        assert math.isnan(g["fan_percent"]) or between(g["fan_percent"], 0, 100)
        assert math.isnan(g["throttle_mask"]) or g["throttle_mask"] >= 0
    idx = backend.device_index
    # NaN is allowed where a container hides our PID from NVML.
    process_mem = out[f"gpu{idx}_process_mem_bytes"]
    assert math.isnan(process_mem) or process_mem > 0
    assert all(not math.isnan(out[k]) for k in ALLOCATOR_KEYS)
    assert out["cuda_allocated_bytes"] > 0
    assert out["cuda_reserved_bytes"] >= out["cuda_allocated_bytes"]
    assert out["cuda_peak_allocated_bytes"] >= out["cuda_allocated_bytes"]
    gauges = backend.device_gauges(out)
    assert len(gauges) == backend.gpu_count and gauges[idx]["name"] == backend.devices[idx]


def test_pcie_latency_when_opted_in() -> None:
    backend = CudaBackend(torch.cuda.current_device(), pcie=True)
    try:
        out = backend.sample()
        backend.sample()
    finally:
        backend.close()
    print(
        "\npcie latency (µs):",
        {k: v for k, v in backend.field_latency_us().items() if k.startswith("pcie")},
    )
    value = out["gpu0_pcie_tx_bytes_per_s"]
    assert math.isnan(value) or value >= 0
