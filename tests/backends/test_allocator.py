"""The CUDA allocator's counters read per interval, against a fake allocator whose
memory_stats() dicts carry the key set of a real GPU."""

from __future__ import annotations

import math

import pytest
from tests.backends.fake_allocator import KEYS, FakeAllocator, memory_stats

from nbmonitor.backends._allocator import ALLOCATOR_KEYS, AllocatorReader


def test_the_fake_has_the_real_key_set() -> None:
    stats = memory_stats()
    assert len(KEYS) == 6 + 9 * 3 * 4 + 2 * 4 == len(stats)
    assert "inactive_split_bytes.all.current" in stats and "num_alloc_retries" in stats
    with pytest.raises(AssertionError):
        memory_stats({"allocated_bytes.current": 1})  # not a key torch returns


def test_interval_peak_without_resetting_the_process_peak() -> None:
    alloc = FakeAllocator()
    reader = AllocatorReader(total_bytes=10_000.0)
    alloc.alloc(1_000)
    first = reader.read(alloc.stats())
    assert set(first) == set(ALLOCATOR_KEYS)
    assert math.isnan(first["cuda_interval_peak_bytes"])  # no interval yet
    # A step that allocates 3,000 more and frees them: a new process peak, exact.
    alloc.alloc(3_000)
    alloc.free(3_000)
    second = reader.read(alloc.stats())
    assert second["cuda_interval_peak_bytes"] == 4_000.0
    assert second["cuda_peak_allocated_bytes"] == 4_000.0
    assert second["cuda_allocated_bytes"] == 1_000.0
    # A smaller step: the process peak stands; the interval's is bounded by what was allocated.
    alloc.alloc(500)
    alloc.free(500)
    third = reader.read(alloc.stats())
    assert third["cuda_interval_peak_bytes"] == 1_500.0
    assert third["cuda_peak_allocated_bytes"] == 4_000.0  # untouched: nobody reset it
    # Several steps in one interval: never above the process peak.
    for _ in range(10):
        alloc.alloc(2_000)
        alloc.free(2_000)
    assert reader.read(alloc.stats())["cuda_interval_peak_bytes"] == 4_000.0
    assert third["cuda_total_bytes"] == 10_000.0


def test_fragmentation_retries_ooms_and_non_pytorch_memory() -> None:
    alloc = FakeAllocator()
    alloc.alloc(6_000)
    alloc.reserved = 9_000
    alloc.inactive_split = 1_200
    alloc.retries = 3
    alloc.ooms = 1
    reader = AllocatorReader()
    out = reader.read(alloc.stats(), process_used=9_500.0)
    assert out["cuda_reserved_bytes"] - out["cuda_allocated_bytes"] == 3_000.0
    assert out["cuda_inactive_split_bytes"] == 1_200.0
    assert (out["cuda_alloc_retries"], out["cuda_ooms"]) == (3.0, 1.0)
    assert out["cuda_non_pytorch_bytes"] == 500.0  # the CUDA context, workspaces, ...
    assert math.isnan(reader.read(alloc.stats())["cuda_non_pytorch_bytes"])  # no NVML
    assert math.isnan(out["cuda_total_bytes"])


def test_missing_keys_are_nan() -> None:
    out = AllocatorReader().read({"allocated_bytes.all.current": 5})
    assert out["cuda_allocated_bytes"] == 5.0
    assert math.isnan(out["cuda_reserved_bytes"]) and math.isnan(out["cuda_alloc_retries"])


def test_allocator_settings_are_parsed_as_pytorch_does() -> None:
    from nbmonitor.backends.alloc_conf import alloc_conf

    assert alloc_conf({}) == {
        "variable": None,
        "text": None,
        "options": {},
        "expandable_segments": False,
    }
    got = alloc_conf(
        {
            "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128, roundup_power2_divisions:"
            "[64:8,>:1],expandable_segments:True",
            "PYTORCH_ALLOC_CONF": "expandable_segments:False",  # ignored: the other is set
        }
    )
    assert got["variable"] == "PYTORCH_CUDA_ALLOC_CONF"
    assert got["options"] == {
        "max_split_size_mb": "128",
        "roundup_power2_divisions": "[64:8,>:1]",
        "expandable_segments": "True",
    }
    assert got["expandable_segments"] is True
    newer = alloc_conf({"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert newer["variable"] == "PYTORCH_ALLOC_CONF" and newer["expandable_segments"] is True
    assert alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": "garbage,,:x"})["options"] == {}


def test_meta_json_says_which_allocator_settings_were_in_effect(tmp_path, monkeypatch) -> None:
    import json

    import torch

    import nbmonitor

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    model = torch.nn.Linear(2, 2)
    with nbmonitor.attach(model, None, run_dir=tmp_path, display=False, interval=60) as mon:
        pass
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert meta["allocator"]["text"] == "expandable_segments:True"
    assert meta["allocator"]["expandable_segments"] is True
