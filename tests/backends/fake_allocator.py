"""``torch.cuda.memory_stats()`` dictionaries with the key set a real GPU returns.

The keys are those of PyTorch's ``THCPModule_memoryStats`` (torch/csrc/cuda/Module.cpp), as
``torch.cuda.memory_stats`` flattens them (``"allocated_bytes.all.current"``): six counters,
nine statistics per pool (all, small_pool, large_pool) and two oversize statistics, each with
current, peak, allocated and freed.
"""

from __future__ import annotations

from collections.abc import Mapping

COUNTERS = (
    "num_alloc_retries",
    "num_ooms",
    "max_split_size",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
)
POOLED = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
POOLS = ("all", "small_pool", "large_pool")
STATS = ("current", "peak", "allocated", "freed")
OVERSIZE = ("oversize_allocations", "oversize_segments")

KEYS = frozenset(
    [*COUNTERS]
    + [f"{name}.{pool}.{stat}" for name in POOLED for pool in POOLS for stat in STATS]
    + [f"{name}.{stat}" for name in OVERSIZE for stat in STATS]
)


def memory_stats(values: Mapping[str, int] | None = None) -> dict[str, int]:
    """A full, sorted memory_stats() dict: zeros, then ``values`` (keys it must have)."""
    out = dict.fromkeys(sorted(KEYS), 0)
    for key, value in (values or {}).items():
        assert key in KEYS, f"not a memory_stats() key: {key}"
        out[key] = value
    out["max_split_size"] = out["max_split_size"] or -1  # unlimited, as torch reports it
    return out


class FakeAllocator:
    """The caching allocator's counters as a loop moves them: ``alloc``/``free`` bytes."""

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.allocated = 0
        self.freed = 0
        self.reserved = 0
        self.reserved_peak = 0
        self.inactive_split = 0
        self.retries = 0
        self.ooms = 0

    def alloc(self, n: int) -> None:
        self.current += n
        self.allocated += n
        self.peak = max(self.peak, self.current)
        self.reserved = max(self.reserved, self.current)
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def free(self, n: int) -> None:
        self.current -= n
        self.freed += n

    def stats(self) -> dict[str, int]:
        return memory_stats(
            {
                "allocated_bytes.all.current": self.current,
                "allocated_bytes.all.peak": self.peak,
                "allocated_bytes.all.allocated": self.allocated,
                "allocated_bytes.all.freed": self.freed,
                "reserved_bytes.all.current": self.reserved,
                "reserved_bytes.all.peak": self.reserved_peak,
                "inactive_split_bytes.all.current": self.inactive_split,
                "num_alloc_retries": self.retries,
                "num_ooms": self.ooms,
            }
        )
