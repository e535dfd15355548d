"""The Memory tab's table: per device, what the breakdown counts and what was measured."""

from __future__ import annotations

import math

from nbmonitor._engine.derive.memory_table import memory_table
from nbmonitor._engine.store import Store
from nbmonitor.memory import MemoryBreakdown, MemoryRow

MIB = 2**20


def rows(device: str) -> tuple[MemoryRow, ...]:
    return (
        MemoryRow("parameters", "0", "float32", device, 4 * MIB, 2),
        MemoryRow("parameters", "1", "bfloat16", device, 2 * MIB, 2),
        MemoryRow("gradients", "0", "float32", device, 4 * MIB, 2),
        MemoryRow("optimizer_state", "0", "float32", device, 8 * MIB, 4),
        MemoryRow("activations", "1", "float32", device, 16 * MIB, 9),
    )


def system(**columns: list[float]) -> Store:
    store = Store()
    n = len(next(iter(columns.values())))
    store.extend([{"step": float(i), **{k: v[i] for k, v in columns.items()}} for i in range(n)])
    return store


def test_cuda_rows_against_the_newest_interval_peak_and_other_devices_unmeasured() -> None:
    b = MemoryBreakdown(
        (*rows("cuda:0"), MemoryRow("optimizer_state", "0", "float32", "cpu", 3 * MIB, 1)),
        step=40, activations_step=30,
    )  # fmt: skip
    # The newest finite interval peak wins; a NaN sample after it does not hide it.
    sys = system(
        cuda_interval_peak_bytes=[30.0 * MIB, 50.0 * MIB, math.nan],
        cuda_allocated_bytes=[20.0 * MIB, 20.0 * MIB, 20.0 * MIB],
        process_rss_bytes=[900.0 * MIB, 1000.0 * MIB, 1100.0 * MIB],
    )
    table = memory_table(b, sys, 0)
    assert table is not None and (table.step, table.activations_step) == (40, 30)
    assert [r["device"] for r in table.rows] == ["cuda:0", "cpu"]
    gpu, cpu = table.rows
    assert (gpu["parameters"], gpu["gradients"]) == (6 * MIB, 4 * MIB)
    assert gpu["optimizer_state"] == 8 * MIB
    assert (gpu["buffers"], gpu["activations"]) == (0, 16 * MIB)
    assert gpu["measured"] == 50 * MIB and gpu["measured_what"] == "peak of the last interval"
    assert gpu["other"] == (50 - 34) * MIB
    assert cpu["optimizer_state"] == 3 * MIB
    assert cpu["measured"] == 1100 * MIB and cpu["other"] == 1097 * MIB


def test_what_is_not_measured_is_nan_and_other_never_negative() -> None:
    b = MemoryBreakdown(rows("cuda:1"))
    # A CUDA device other than the training one: the samples do not measure it.
    table = memory_table(b, system(cuda_allocated_bytes=[5.0 * MIB]), 0)
    assert table is not None
    assert [r["device"] for r in table.rows] == ["cuda:0", "cuda:1"]  # the training device first
    home, other = table.rows
    assert home["parameters"] == 0 and home["measured"] == 5 * MIB
    assert home["measured_what"] == "allocated"
    assert math.isnan(float(other["measured"])) and math.isnan(float(other["other"]))
    # Measured below what the breakdown counts (read at another moment): other is 0, not less.
    cpu = memory_table(MemoryBreakdown(rows("cpu")), system(process_rss_bytes=[1.0 * MIB]), None)
    assert cpu is not None and cpu.rows[0]["other"] == 0.0
    assert memory_table(None, Store(), None) is None


def test_the_allocator_settings_from_meta_json_bounded_and_only_on_cuda() -> None:
    from nbmonitor._engine.derive.memory_table import allocator_text
    from nbmonitor._engine.run_state import run_info
    from nbmonitor.backends.alloc_conf import alloc_conf

    conf = alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert allocator_text(conf) == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert allocator_text(alloc_conf({})) == "default settings"
    # Untrusted meta.json: anything else is unknown, and a long text is cut.
    assert allocator_text(None) == allocator_text([1]) == ""
    assert allocator_text({"variable": 3, "text": "x"}) == ""
    assert len(allocator_text({"variable": "V", "text": "x" * 10_000})) == 200
    cuda = {"backend": {"name": "cuda", "device_index": 0}, "allocator": conf}
    assert run_info(cuda, "r").allocator == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    cpu = {"backend": {"name": "cpu", "device_index": None}, "allocator": conf}
    assert run_info(cpu, "r").allocator == ""  # a CPU run has no CUDA allocator to speak of


def test_bytes_of_every_category_and_device_is_the_sum_of_its_rows():
    """``MemoryBreakdown.bytes`` reads totals kept by (category, device): the same sums as
    adding up the rows, for every combination the table and the batch estimate ask."""
    mixed = (*rows("cuda:0"), *rows("cpu"), MemoryRow("buffers", "2", "int64", "cpu", 24, 1))
    breakdown = MemoryBreakdown(mixed + rows("cuda:1")[:2])
    categories = [None, *{r.category for r in breakdown.rows}, "nothing"]
    devices = [None, "cuda:0", "cuda:1", "cpu", "mps"]
    for category in categories:
        for device in devices:
            expected = sum(
                r.bytes
                for r in breakdown.rows
                if category in (None, r.category) and device in (None, r.device)
            )
            assert breakdown.bytes(category, device=device) == expected
    assert breakdown.bytes() == breakdown.total_bytes
