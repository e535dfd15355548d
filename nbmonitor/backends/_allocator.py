"""The CUDA caching allocator's counters (``torch.cuda.memory_stats``), read on the sampler
thread as per-interval values, without ever resetting them.

``memory_stats()`` reads host-side counters: no device sync. Its peak is process-wide and
only ``reset_peak_memory_stats`` lowers it; code of the user's that reads
``torch.cuda.max_memory_allocated()`` must keep its meaning (DESIGN section 4), so the peak of
an interval is found from deltas instead:

* when the process-wide peak rose since the previous reading, the interval reached it: exact;
* otherwise the interval's peak is at most what was allocated at the previous reading plus
  every byte allocated since (``allocated_bytes.all.allocated`` counts them), and at most the
  process-wide peak: an upper bound, and at least the larger of the two readings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

ALLOCATOR_KEYS = (
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "cuda_peak_allocated_bytes",
    "cuda_peak_reserved_bytes",
    "cuda_interval_peak_bytes",
    "cuda_inactive_split_bytes",
    "cuda_non_pytorch_bytes",
    "cuda_total_bytes",
    "cuda_alloc_retries",
    "cuda_ooms",
)
# Straight from a memory_stats() key.
_SOURCES = {
    "cuda_allocated_bytes": "allocated_bytes.all.current",
    "cuda_reserved_bytes": "reserved_bytes.all.current",
    "cuda_peak_allocated_bytes": "allocated_bytes.all.peak",
    "cuda_peak_reserved_bytes": "reserved_bytes.all.peak",
    "cuda_inactive_split_bytes": "inactive_split_bytes.all.current",
    "cuda_alloc_retries": "num_alloc_retries",
    "cuda_ooms": "num_ooms",
}
_CUMULATIVE = "allocated_bytes.all.allocated"


class AllocatorReader:
    """Turns successive ``memory_stats()`` dicts into the ``ALLOCATOR_KEYS`` of each interval.

    ``total_bytes`` is the device's memory (torch's ``total_memory``); ``process_used`` what
    NVML says this process uses on the device (NaN without NVML): what PyTorch did not reserve
    of it (the CUDA context, cuBLAS/cuDNN workspaces, NCCL, other allocators) is
    ``cuda_non_pytorch_bytes``.
    """

    def __init__(self, total_bytes: float = math.nan) -> None:
        self.total_bytes = total_bytes
        self._last: tuple[float, float, float] | None = None  # current, peak, cumulative

    def read(self, stats: Mapping[str, int], process_used: float = math.nan) -> dict[str, float]:
        out = {
            key: float(stats[src]) if src in stats else math.nan for key, src in _SOURCES.items()
        }
        current, peak = out["cuda_allocated_bytes"], out["cuda_peak_allocated_bytes"]
        cumulative = float(stats.get(_CUMULATIVE, math.nan))
        out["cuda_interval_peak_bytes"] = self._interval_peak(current, peak, cumulative)
        self._last = (current, peak, cumulative)
        non_pytorch = process_used - out["cuda_reserved_bytes"]  # NaN without NVML
        out["cuda_non_pytorch_bytes"] = (
            max(0.0, non_pytorch) if non_pytorch == non_pytorch else non_pytorch
        )
        out["cuda_total_bytes"] = self.total_bytes
        return out

    def _interval_peak(self, current: float, peak: float, cumulative: float) -> float:
        last = self._last
        if last is None:
            return math.nan  # no interval yet
        last_current, last_peak, last_cumulative = last
        if peak > last_peak:
            return peak
        bound = min(peak, last_current + max(0.0, cumulative - last_cumulative))
        return max(bound, current, last_current)
