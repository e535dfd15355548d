"""How much memory is left, and the largest batch that would fit, from the recent system
samples and the memory breakdown.

A step's peak is what stays (parameters, buffers, gradients, optimizer state: they do not
depend on the batch) plus what the batch brings (activations and temporaries, about
proportional to it). So with ``fixed`` the first and ``peak`` the step's peak at batch ``b``,
a batch ``B`` needs about ``fixed + (peak - fixed) * B / b``, and the largest that fits
``limit`` (with a margin for the allocator's rounding and fragmentation) is
``b * (limit * MARGIN - fixed) / (peak - fixed)``.

On CUDA the peak is the allocator's process-wide peak (never reset: it may include what ran
before attach, which only makes the estimate cautious) and the limit the device's memory less
what is not PyTorch's (the CUDA context, workspaces); on the CPU the peak is the process's
largest resident size in the window and the limit the machine's memory less what other
processes use.

On the CPU the resident size holds much more than tensors (the interpreter, libraries, threads'
arenas, the allocator's caches; on a small model most of the peak), and much of it appears after
attach whatever the batch, so ``peak - fixed`` would take all of it as growing with the batch:
an estimate 10-20 times too small (benchmarks/batch_fit.py, benchmarks/NOTES.md). What grows
with the batch there is taken as at most ``CPU_ACTIVATION_FACTOR`` times the activations the
breakdown saw saved for backward (the backward's temporaries on top of them).
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from nbmonitor._engine.store import FloatArray, Store
from nbmonitor.memory import MemoryBreakdown

WINDOW = 120  # system samples (a minute at the default interval)
MARGIN = 0.95  # of the limit a batch may plan to use
STEP_WINDOW = 20
FIXED = ("parameters", "buffers", "gradients", "optimizer_state")
# Saved activations times this bounds what a CPU step's peak gains per batch (measured 1.5-1.7
# on an MLP, whose backward temporaries are large next to its saved tensors: a cautious bound).
CPU_ACTIVATION_FACTOR = 2.0
# The linear estimate is said up to this many times the batch measured (benchmarks/batch_fit.py
# checked it up to about 7 times); beyond, the header says "over" that many: a lower bound,
# not a count read off a line drawn far past what was measured (on a small CPU model, millions).
MAX_FACTOR = 16


def _finite(values: FloatArray) -> FloatArray:
    return values[np.isfinite(values)]


def _last(system: Store, key: str) -> float:
    if key not in system.columns:
        return math.nan
    values = _finite(system.tail(key, WINDOW))
    return float(values[-1]) if values.size else math.nan


def _max(system: Store, key: str) -> float:
    if key not in system.columns:
        return math.nan
    values = _finite(system.tail(key, WINDOW))
    return float(values.max()) if values.size else math.nan


def batch_size(steps: Store) -> float:
    """Samples per micro-batch over the recent steps (median), NaN when unknown."""
    if "samples" not in steps.columns or "micro_batches" not in steps.columns:
        return math.nan
    samples = steps.tail("samples", STEP_WINDOW)
    micro = steps.tail("micro_batches", STEP_WINDOW)
    ok = np.isfinite(samples) & np.isfinite(micro) & (samples > 0) & (micro > 0)
    if not ok.any():
        return math.nan
    return float(statistics.median((samples[ok] / micro[ok]).tolist()))


def fits(batch: float, peak: float, fixed: float, limit: float) -> float:
    """The largest batch whose peak stays under ``limit * MARGIN`` (NaN when unknown)."""
    per_batch = peak - fixed
    if not (batch > 0 and per_batch > 0 and limit > 0 and fixed >= 0):
        return math.nan
    return float(max(0, math.floor(batch * (limit * MARGIN - fixed) / per_batch)))


def fixed_bytes(breakdown: MemoryBreakdown, device: str, peak: float) -> float:
    """The part of ``peak`` on ``device`` that does not grow with the batch: parameters,
    buffers, gradients and optimizer state; on the CPU also every resident byte beyond
    ``CPU_ACTIVATION_FACTOR`` times the saved activations (see the module's doc)."""
    fixed = float(sum(breakdown.bytes(c, device=device) for c in FIXED))
    activations = breakdown.bytes("activations", device=device)
    if device == "cpu" and activations > 0:
        fixed = max(fixed, peak - CPU_ACTIVATION_FACTOR * activations)
    return fixed


def headroom(
    system: Store, steps: Store, breakdown: MemoryBreakdown | None, device_index: int | None
) -> dict[str, float]:
    """``memory_peak_bytes``, ``memory_limit_bytes``, ``memory_headroom_bytes``,
    ``batch_size``, ``batch_fits`` and ``batch_fits_more`` (1 when more than ``batch_fits``
    fit: the estimate was beyond ``MAX_FACTOR`` times the batch) ({} when the device's
    memory is unknown)."""
    if device_index is not None:
        device = f"cuda:{device_index}"
        peak = _last(system, "cuda_peak_allocated_bytes")
        total = _last(system, "cuda_total_bytes")
        other = _last(system, "cuda_non_pytorch_bytes")
        limit = total - (other if math.isfinite(other) else 0.0)
    elif "mps_allocated_bytes" in system.columns:
        return {}  # unified memory shared with the GPU: not estimated
    else:
        device = "cpu"
        peak = _max(system, "process_rss_bytes")
        total = _last(system, "ram_total_bytes")
        used = _last(system, "ram_used_bytes")
        rss = _last(system, "process_rss_bytes")
        # Other processes' memory is not ours to use.
        limit = total - max(0.0, used - rss) if math.isfinite(used + rss) else total
    if not (math.isfinite(peak) and math.isfinite(limit) and limit > 0):
        return {}
    out = {
        "memory_peak_bytes": peak,
        "memory_limit_bytes": limit,
        "memory_headroom_bytes": limit - peak,
    }
    batch = batch_size(steps)
    if breakdown is not None and math.isfinite(batch):
        out["batch_size"] = batch
        estimate = fits(batch, peak, fixed_bytes(breakdown, device, peak), limit)
        bound = math.floor(batch * MAX_FACTOR)
        out["batch_fits"] = min(estimate, bound) if math.isfinite(estimate) else estimate
        out["batch_fits_more"] = float(math.isfinite(estimate) and estimate > bound)
    return out
