"""The batch-size estimate against measured runs (benchmarks/batch_fit.py), each batch in its own
process on the CPU, its peak resident size read from the kernel's high-water mark (``VmHWM``,
not ``ru_maxrss``, which a child inherits from its parent). From a run at batch 8192 and a limit
256 MiB above its peak, the estimated batch must fit under the 95 % of the limit it plans for,
and a batch 50 % larger must not fit the limit: the real largest batch lies between the estimate
and 1.5 times it.

A deterministic case: a Linear and 32 Tanh, whose saved outputs cost memory and next to no
time (large batches in seconds); glibc's mmap threshold pinned, so that the resident size
follows the tensors (unpinned, the same batch's peak moves by tens of MiB from run to run); the
true peak rather than the monitor's sampled one. The fixed part is what
``headroom.fixed_bytes`` takes from the run's breakdown. benchmarks/NOTES.md ("Batch that
fits") has the sweep of an MLP with the default allocator behind the tolerance.
"""

from __future__ import annotations

import math

import pytest
from benchmarks.batch_fit import run_one

from nbmonitor._engine.derive.headroom import MARGIN, fits, fixed_bytes
from nbmonitor.memory import MemoryBreakdown, MemoryRow

pytestmark = pytest.mark.slow

BASE = 8192
HEADROOM = 256 * 2**20
TOLERANCE = 0.5


def run(batch: int) -> dict[str, float]:
    return run_one(batch, width=256, depth=32, kind="tanh", pin_malloc=True)


@pytest.mark.timeout(900)
def test_the_estimated_batch_fits_and_one_50_percent_larger_does_not() -> None:
    base = run(BASE)
    assert base["monitor_batch"] == BASE and base["activations"] > 0
    limit = base["true_peak"] + HEADROOM
    rows = (
        MemoryRow("parameters", "0", "float32", "cpu", int(base["fixed"]), 1),
        MemoryRow("activations", "0", "float32", "cpu", int(base["activations"]), 1),
    )
    fixed = fixed_bytes(MemoryBreakdown(rows), "cpu", base["true_peak"])
    estimate = fits(BASE, base["true_peak"], fixed, limit)
    assert math.isfinite(estimate) and estimate > BASE, (estimate, base)
    at_estimate = run(int(estimate))
    assert at_estimate["true_peak"] <= limit * MARGIN, (estimate, at_estimate, limit)
    larger = run(math.ceil(estimate * (1 + TOLERANCE)))
    assert larger["true_peak"] > limit, (estimate, larger, limit)
