"""MFU arithmetic (``_engine/derive/mfu.py``) against hand-computed values: device names as
torch reports them, the peak table, FLOPs per step and the per-step row."""

from __future__ import annotations

import math

import pytest

from nbmonitor._engine.assemble.steps import StepAssembler
from nbmonitor._engine.derive.mfu import (
    PEAK_FLOPS,
    StepFlops,
    device_key,
    mfu_percent,
    peak_flops,
)
from nbmonitor.records import FlopsRecord, StepRecord


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("Apple M2 Pro GPU (MPS)", "Apple M2 Pro"),
        ("Apple M1 GPU (MPS)", "Apple M1"),
        ("NVIDIA GeForce RTX 3090 Ti", None),
        ("NVIDIA L40", None),
        ("CPU", None),
        ("Apple GPU (MPS)", None),
        (None, None),
    ],
)
def test_device_names_find_their_row(name: str | None, key: str | None) -> None:
    assert device_key(name) == key


@pytest.mark.parametrize(
    ("device", "dtype", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4e12),
        ("NVIDIA H100 80GB HBM3", "tfloat32", 494.7e12),
        ("NVIDIA H100 PCIe", "float16", 756e12),
        ("NVIDIA H100 NVL", "bfloat16", 835.5e12),
        ("NVIDIA H200", "bfloat16", 989.4e12),
        ("NVIDIA B200", "bfloat16", 2250e12),
        ("NVIDIA A100-SXM4-40GB", "float32", 19.5e12),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312e12),
        ("NVIDIA L40S", "bfloat16", 362.05e12),
        ("NVIDIA L4", "float16", 121e12),
        ("NVIDIA A10G", "bfloat16", 125e12),
        ("Tesla T4", "float16", 65e12),
        ("NVIDIA GeForce RTX 4090", "bfloat16", 165.2e12),
        ("NVIDIA GeForce RTX 3090", "float16", 71e12),
        ("NVIDIA H100 80GB HBM3", "float8_e4m3fn", 1978.9e12),
        ("Apple M1 Max GPU (MPS)", "float32", 10.4e12),
    ],
)
def test_peak_by_device_and_precision(device: str, dtype: str, peak: float) -> None:
    assert peak_flops(device, dtype) == (peak, "")


def test_every_row_has_positive_peaks() -> None:
    for row in PEAK_FLOPS.values():
        assert row and all(v > 1e12 for v in row.values())


def test_unknown_device_or_precision_says_why() -> None:
    peak, note = peak_flops("CPU", "float32")
    assert math.isnan(peak)
    assert note.startswith("MFU is not shown: nbmonitor has no peak FLOP/s for CPU")
    peak, note = peak_flops("Tesla T4", "bfloat16")
    assert math.isnan(peak)
    assert "no bfloat16 peak for the T4 (known: float32, float16)" in note


def test_mfu_percent_by_hand() -> None:
    # Half the H100 SXM's dense bf16 peak is 50 %.
    assert mfu_percent(494.7e12, 989.4e12) == pytest.approx(50.0)
    assert mfu_percent(156e12, 312e12) == pytest.approx(50.0)
    assert math.isnan(mfu_percent(1e12, math.nan))
    assert math.isnan(mfu_percent(math.nan, 1e12))
    assert math.isnan(mfu_percent(1e12, 0.0))


def test_step_values_by_hand() -> None:
    # A forward of 1e12 FLOPs over 1,000 tokens: 3e9 training FLOPs per token.
    flops = StepFlops.from_count(1e12, 1000, 8, "bfloat16", "NVIDIA A100-SXM4-80GB")
    assert flops.per_token == 3e9 and flops.per_sample == 3e12 / 8
    # 2,000 tokens in 0.1 s: 6e12 FLOPs, 60 TFLOP/s, 60/312 of the peak.
    values = flops.step_values(tokens=2000, samples=16, step_time=0.1)
    assert values["flops_per_step"] == pytest.approx(6e12)
    assert values["tflops_per_s"] == pytest.approx(60.0)
    assert values["mfu_percent"] == pytest.approx(100 * 60 / 312)
    # Without tokens the samples scale the count; with neither there is nothing to say.
    by_samples = flops.step_values(tokens=0, samples=16, step_time=1.0)
    assert by_samples["flops_per_step"] == pytest.approx(6e12)
    assert flops.step_values(tokens=0, samples=0, step_time=1.0) == {}
    assert math.isnan(flops.step_values(2000, 16, 0.0)["tflops_per_s"])


def test_the_assembler_fills_mfu_on_a_known_device() -> None:
    assembler = StepAssembler(device=lambda: "NVIDIA H100 80GB HBM3")
    record = FlopsRecord(step=1, forward_flops=1e12, tokens=4096, samples=4, dtype="bfloat16")
    steps = [
        StepRecord(step=s, time=0.0, step_time=0.5, samples=4, micro_batches=1, lrs=(),
                   tokens=4096)
        for s in (1, 2)
    ]  # fmt: skip
    assembler.add([record, *steps])
    [row] = assembler.take_final()
    assert row["tokens_per_s"] == 8192.0
    assert row["flops_per_step"] == pytest.approx(3e12)
    assert row["tflops_per_s"] == pytest.approx(6.0)
    assert row["mfu_percent"] == pytest.approx(100 * 6e12 / 989.4e12)
    assert assembler.flops is not None and assembler.flops.note == ""
