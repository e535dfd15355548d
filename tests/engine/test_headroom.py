"""The headroom and the largest batch that fits, from system samples and the breakdown."""

from __future__ import annotations

import math

from nbmonitor._engine.derive.headroom import (
    CPU_ACTIVATION_FACTOR,
    MARGIN,
    MAX_FACTOR,
    fits,
    headroom,
)
from nbmonitor._engine.store import Store
from nbmonitor.memory import MemoryBreakdown, MemoryRow

GIB = 2.0**30


def breakdown(device: str, fixed: float, activations: float = 123) -> MemoryBreakdown:
    return MemoryBreakdown(
        (
            MemoryRow("parameters", "0", "float32", device, int(fixed / 4), 2),
            MemoryRow("gradients", "0", "float32", device, int(fixed / 4), 2),
            MemoryRow("optimizer_state", "0", "float32", device, int(fixed / 2), 4),
            MemoryRow("activations", "0", "float32", device, int(activations), 1),  # per batch
            MemoryRow("parameters", "(other)", "float32", "cuda:1", 10**9, 1),  # another device
        )
    )


def steps(batch: int, micro: int = 1) -> Store:
    store = Store()
    store.extend([{"step": float(i), "samples": float(batch * micro), "micro_batches": micro}
                  for i in range(1, 11)])  # fmt: skip
    return store


def test_fits_is_linear_in_what_the_batch_brings() -> None:
    # 16 GiB fixed, 32 GiB more at batch 8 (4 GiB a sample): 80 * 0.95 = 76 -> (76-16)/4 = 15.
    assert fits(8, 48 * GIB, 16 * GIB, 80 * GIB) == 15
    assert fits(8, 48 * GIB, 16 * GIB, 80 * GIB) == math.floor(8 * (80 * MARGIN - 16) / 32)
    assert fits(8, 90 * GIB, 70 * GIB, 80 * GIB) == 2
    assert fits(8, 90 * GIB, 78 * GIB, 80 * GIB) == 0  # the fixed part alone leaves no room
    assert math.isnan(fits(8, 10 * GIB, 16 * GIB, 80 * GIB))  # peak below the fixed part
    assert math.isnan(fits(math.nan, 48 * GIB, 16 * GIB, 80 * GIB))


def test_cuda_headroom_from_the_allocator_peak_and_the_device() -> None:
    system = Store()
    system.extend(
        [
            {
                "step": float(i),
                "cuda_peak_allocated_bytes": 48 * GIB,
                "cuda_total_bytes": 81 * GIB,
                "cuda_non_pytorch_bytes": 1 * GIB,
            }
            for i in range(5)
        ]
    )
    got = headroom(system, steps(4, micro=2), breakdown("cuda:0", 16 * GIB), 0)
    assert got["memory_limit_bytes"] == 80 * GIB
    assert got["memory_headroom_bytes"] == 32 * GIB
    assert got["batch_size"] == 4  # samples per micro-batch
    assert got["batch_fits"] == math.floor(4 * (80 * MARGIN - 16) / 32)
    # Without a breakdown yet: the headroom, no batch.
    assert "batch_fits" not in headroom(system, steps(4), None, 0)
    assert headroom(Store(), steps(4), None, 0) == {}


def test_cpu_headroom_leaves_other_processes_their_memory() -> None:
    system = Store()
    rss = [3 * GIB, 5 * GIB, 3 * GIB]
    system.extend(
        [
            {"step": float(i), "process_rss_bytes": r, "ram_total_bytes": 16 * GIB,
             "ram_used_bytes": r + 4 * GIB}
            for i, r in enumerate(rss)
        ]
    )  # fmt: skip
    # Activations large enough to explain the peak above the tensors: peak - fixed grows.
    got = headroom(system, steps(32), breakdown("cpu", 1 * GIB, activations=2 * GIB), None)
    assert got["memory_peak_bytes"] == 5 * GIB
    assert got["memory_limit_bytes"] == 12 * GIB
    assert got["batch_fits"] == math.floor(32 * (12 * MARGIN - 1) / 4)


def test_on_the_cpu_the_resident_size_beyond_the_tensors_does_not_grow_with_the_batch() -> None:
    # 5 GiB resident at the peak, 1 GiB of it parameters, gradients and optimizer state, and
    # 0.25 GiB of saved activations: the interpreter, libraries and caches (3.5 GiB here) are
    # not the batch's. What grows is at most twice the activations.
    system = Store()
    system.extend([{"step": 1.0, "process_rss_bytes": 5 * GIB, "ram_total_bytes": 12 * GIB,
                    "ram_used_bytes": 5 * GIB}])  # fmt: skip
    got = headroom(system, steps(32), breakdown("cpu", 1 * GIB, activations=GIB / 4), None)
    per_batch = CPU_ACTIVATION_FACTOR * GIB / 4
    assert got["batch_fits"] == math.floor(32 * (12 * MARGIN - (5 * GIB - per_batch) / GIB) / 0.5)
    assert got["batch_fits"] == math.floor(32 + 32 * (12 * MARGIN - 5) / 0.5)  # the same
    # Before any activation was sampled, the breakdown's fixed part alone (cautious).
    got = headroom(system, steps(32), breakdown("cpu", 1 * GIB, activations=0), None)
    assert got["batch_fits"] == math.floor(32 * (12 * MARGIN - 1) / 4)
    # On CUDA the allocator's peak holds only tensors: the rule is the CPU's alone.
    cuda = Store()
    cuda.extend([{"step": 1.0, "cuda_peak_allocated_bytes": 5 * GIB, "cuda_total_bytes": 12 * GIB}])
    got = headroom(cuda, steps(32), breakdown("cuda:0", 1 * GIB, activations=GIB / 4), 0)
    assert got["batch_fits"] == math.floor(32 * (12 * MARGIN - 1) / 4)


def test_beyond_max_factor_times_the_batch_the_estimate_is_a_lower_bound() -> None:
    # A small model on a CPU with 22 GiB free (the quickstart's MLP at batch 64): 100 KiB of
    # saved activations would put the line at millions of samples. What is said: over 16
    # times the batch fit, flagged as a lower bound.
    system = Store()
    system.extend([{"step": 1.0, "process_rss_bytes": 0.33 * GIB, "ram_total_bytes": 24 * GIB,
                    "ram_used_bytes": 2 * GIB}])  # fmt: skip
    got = headroom(system, steps(64), breakdown("cpu", 2**20, activations=100 * 2**10), None)
    assert fits(64, 0.33 * GIB, 0.33 * GIB - 200 * 2**10, got["memory_limit_bytes"]) > 10**6
    assert got["batch_fits"] == 64 * MAX_FACTOR and got["batch_fits_more"] == 1.0
    # Within the range, the estimate itself, not flagged.
    cuda = Store()
    cuda.extend(
        [{"step": 1.0, "cuda_peak_allocated_bytes": 48 * GIB, "cuda_total_bytes": 80 * GIB}]
    )
    got = headroom(cuda, steps(8), breakdown("cuda:0", 16 * GIB), 0)
    assert got["batch_fits"] == 15 and got["batch_fits_more"] == 0.0
