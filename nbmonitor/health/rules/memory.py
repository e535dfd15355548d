"""Rules on the memory of the device the model trains on, over recent system samples: the
step's peak near the limit, the CUDA allocator retrying (fragmentation), and memory that grows
step after step (a leak). Subject: the GPU (``gpu(i)``) on CUDA, the run on the CPU.

On CUDA they read the allocator's counters (``backends/_allocator.py``); on the CPU the
process's resident size. The functions keep no state, except the leak rule's block floors.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.doc import FINDING, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView

Columns = Mapping[str, npt.NDArray[np.float64]]

# The step's peak at or above this share of what the process may use.
PEAK_FRACTION = 0.9
# Allocation retries within the window that count as climbing.
RETRIES_MIN = 2
# The leak rule: the floor (least memory) of each block of this many samples...
BLOCK_SAMPLES = 3
# ...rises in each of this many blocks in a row, while steps advance...
RISING_BLOCKS = 4
# ...by at least this much in all (allocator rounding and heap noise stay below it).
GROWTH_MIN_BYTES = 8 * 2**20
# Samples before this step are warm-up (first allocations, the optimizer's state).
WARMUP_STEPS = 5
# On the CPU the leak is judged from the process's resident size, which also holds what nbmonitor
# itself keeps: its stores (``monitor_bytes`` in the system samples, subtracted) and what the
# allocator retains of its own work on the sampler thread, which no store counts (the quickstart's
# resident size grows about 3 KiB a step with the monitor, none without: benchmarks/NOTES.md, "The
# quickstart's alerts"). A leak there must also grow by this much a step: a tensor kept per step (an
# output, a loss with its graph) is larger, and a leak smaller than this takes over 100,000 steps to
# reach a few GiB.
RSS_LEAK_PER_STEP = 64 * 2**10


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.3g} MiB"


def _last(columns: Columns, key: str) -> float:
    values = columns.get(key)
    if values is None:
        return math.nan
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if finite.size else math.nan


def _max(columns: Columns, key: str) -> float:
    values = columns.get(key)
    if values is None or not np.isfinite(values).any():
        return math.nan
    return float(np.nanmax(values))


def _where(columns: Columns) -> tuple[int, float]:
    step = _last(columns, "step")
    return (int(step) if math.isfinite(step) else 0), _last(columns, "time")


def _cuda(columns: Columns) -> bool:
    values = columns.get("cuda_allocated_bytes")
    return values is not None and bool(np.isfinite(values).any())


def _subject(gpus: list[int] | None, cuda: bool) -> str:
    return subjects.gpu(gpus[0] if gpus else 0) if cuda else subjects.RUN


def peak_rule(
    columns: Columns, gpus: list[int] | None = None, fraction: float = PEAK_FRACTION
) -> list[Alert]:
    """The step's peak at or above ``fraction`` of what the process may use."""
    step, when = _where(columns)
    cuda = _cuda(columns)
    if cuda:
        peaks = columns.get("cuda_interval_peak_bytes")
        peak = (
            float(np.nanmax(peaks)) if peaks is not None and np.isfinite(peaks).any() else math.nan
        )
        other = _last(columns, "cuda_non_pytorch_bytes")
        limit = _last(columns, "cuda_total_bytes") - (other if math.isfinite(other) else 0.0)
        where = f"GPU {gpus[0] if gpus else 0}"
    else:
        peak = _max(columns, "process_rss_bytes")
        used, total = _last(columns, "ram_used_bytes"), _last(columns, "ram_total_bytes")
        limit = total - max(0.0, used - _last(columns, "process_rss_bytes"))
        where = "This process"
    if not (math.isfinite(peak) and math.isfinite(limit) and limit > 0):
        return []
    if peak < fraction * limit:
        return []
    return [
        Alert(
            "memory_peak",
            "warning",
            f"{where} peaks at {_gib(peak)} of the {_gib(limit)} it can use ({peak / limit:.0%}): "
            "a longer sequence or a larger batch will run out of memory. The header shows the "
            "batch that fits; gradient checkpointing, mixed precision (bf16 autocast) or "
            "zero_grad(set_to_none=True) lower the peak.",
            step,
            when,
            subject=_subject(gpus, cuda),
        )
    ]


def retries_rule(columns: Columns, gpus: list[int] | None = None) -> list[Alert]:
    """The CUDA allocator freed its cache and retried allocations in the window."""
    retries = columns.get("cuda_alloc_retries")
    if retries is None:
        return []
    finite = retries[np.isfinite(retries)]
    if finite.size < 2:
        return []
    new = float(finite[-1] - finite[0])
    if new < RETRIES_MIN:
        return []
    step, when = _where(columns)
    split = _last(columns, "cuda_inactive_split_bytes")
    cached = _last(columns, "cuda_reserved_bytes") - _last(columns, "cuda_allocated_bytes")
    facts = []
    if math.isfinite(split):
        facts.append(f"{_gib(split)} in split blocks that cannot be reused")
    if math.isfinite(cached):
        facts.append(f"{_gib(cached)} reserved but not in tensors")
    frag = f" ({', '.join(facts)})" if facts else ""
    return [
        Alert(
            "alloc_retries",
            "warning",
            f"The CUDA allocator ran out of cached blocks and had to free its cache and retry "
            f"{new:.0f} allocations lately ({finite[-1]:.0f} in all): memory is fragmented{frag}. "
            "Each retry synchronizes the GPU and slows the step. Start the process with "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb:<n>), or "
            "lower the peak.",
            step,
            when,
            subject=_subject(gpus, True),
        )
    ]


class LeakTracker:
    """The floor of memory in successive blocks of samples; a leak is floors that keep rising.

    The floor (least value of a block) removes what a step allocates and frees again
    (activations, temporaries); what is left rising block after block is kept across steps.
    """

    def __init__(self, key: str = "") -> None:
        self.key = key  # the column followed: CUDA memory in tensors, else the process's RSS
        # (floor, the step of that sample), oldest first.
        self.floors: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=RISING_BLOCKS + 1
        )
        self._block: list[tuple[float, float]] = []
        self._last_time = -math.inf
        # Where the current leak became evident: (bytes, steps grown then, the step and time of
        # the sample that completed the block), None while it is not a leak. The alert names
        # that sample, not the newest one: the checks' pace does not move it.
        self.evident: tuple[float, float, float, float] | None = None

    def add(self, columns: Columns) -> None:
        key = "cuda_allocated_bytes" if _cuda(columns) else "process_rss_bytes"
        if key != self.key:  # the first samples, or CUDA came up: start over on that column
            self.__dict__.update(LeakTracker(key).__dict__)
        values, steps, times = columns.get(key), columns.get("step"), columns.get("time")
        if values is None or steps is None or times is None:
            return
        own = columns.get("monitor_bytes")
        if key == "process_rss_bytes" and own is not None and len(own) == len(values):
            values = values - np.where(np.isfinite(own), own, 0.0)
        new = times > self._last_time
        if not new.any():
            return
        self._last_time = float(times[new][-1])
        rows = zip(values[new].tolist(), steps[new].tolist(), times[new].tolist(), strict=True)
        for value, step, when in rows:
            if not (math.isfinite(value) and math.isfinite(step)) or step < WARMUP_STEPS:
                continue
            self._block.append((value, step))
            if len(self._block) == BLOCK_SAMPLES:
                self.floors.append(min(self._block))  # the floor, and the step it was at
                self._block = []
                grown = self.growth()
                if grown is None:
                    self.evident = None
                elif self.evident is None:
                    self.evident = (*grown, step, when)

    def growth(self) -> tuple[float, float] | None:
        """(bytes, steps) grown over the rising blocks, or None while it is not a leak."""
        floors = list(self.floors)
        if len(floors) <= RISING_BLOCKS:
            return None
        rising = all(b[0] > a[0] and b[1] > a[1] for a, b in itertools.pairwise(floors))
        grown, steps = floors[-1][0] - floors[0][0], floors[-1][1] - floors[0][1]
        if not rising or grown < GROWTH_MIN_BYTES or steps <= 0:
            return None
        if self.key == "process_rss_bytes" and grown < RSS_LEAK_PER_STEP * steps:
            return None  # what the monitor's own work retains grows this slowly too
        return grown, steps


class MemoryPeak(Base):
    name = "memory_peak"
    doc = RuleDoc(
        FINDING,
        "the step's memory peak is 90 % or more of what the process can use",
        "the allocator's (CUDA) or the process's (CPU) peak in the recent samples against the "
        "memory it can use",
        "lower the batch size, use gradient checkpointing or mixed precision, "
        "`zero_grad(set_to_none=True)`",
        (),
    )

    def check(self, view: HealthView) -> Outcome:
        system = view.inp.system
        if not system or not view.has_new_rows:
            return nothing(self.name)
        found = peak_rule(system, list(view.inp.gpus or ()))
        if not found:
            return clear(self.name)
        return Outcome(self.name, [found[0].subject], always, lambda _new: found)


class AllocRetries(Base):
    name = "alloc_retries"
    doc = RuleDoc(
        FINDING,
        "the CUDA allocator frees its cache and retries allocations: memory is fragmented",
        "2 or more allocation retries in the recent samples, with the bytes in inactive split "
        "blocks",
        "set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` before CUDA starts, or lower the "
        "peak",
        (),
    )

    def check(self, view: HealthView) -> Outcome:
        system = view.inp.system
        if not system or not view.has_new_rows:
            return nothing(self.name)
        found = retries_rule(system, list(view.inp.gpus or ()))
        if not found:
            return clear(self.name)
        return Outcome(self.name, [found[0].subject], always, lambda _new: found)


class MemoryLeak(Base):
    name = "memory_leak"
    doc = RuleDoc(
        FINDING,
        "memory grows step after step: the loop keeps tensors (a loss kept with its graph, outputs"
        " in a list)",
        "the floor of memory (the least of each block of 3 samples, less the monitor's own stores)"
        " rising in 4 blocks in a row while steps advance",
        "keep `loss.item()`, not the loss; detach or drop kept outputs; bound caches",
        ("the monitor's own memory", "warm-up in the first steps", "a loaded machine"),
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.tracker = LeakTracker()

    def reset(self) -> None:
        self.tracker = LeakTracker()

    def check(self, view: HealthView) -> Outcome:
        system = view.inp.system
        if not system or not view.has_new_rows:
            return nothing(self.name)
        tracker = self.tracker
        tracker.add(system)
        evident = tracker.evident
        if evident is None:
            return clear(self.name)
        nbytes, steps, at, when = evident
        step = int(at)
        cuda = tracker.key == "cuda_allocated_bytes"
        subject = _subject(list(view.inp.gpus or ()), cuda)
        what = "CUDA memory in tensors" if cuda else "The process's memory"
        per_step = nbytes / steps
        alert = Alert(
            "memory_leak",
            "warning",
            f"{what} grows step after step and does not come back: +{_gib(nbytes)} over the "
            f"last {steps:.0f} steps (about {_gib(per_step)} a step). Something keeps tensors "
            "across steps: most often a loss or output kept with its graph (losses.append(loss) "
            "or total += loss without .item()), a list of outputs or logits kept for later, or "
            "a cache that only grows. Keep Python numbers (loss.item() after the step) or "
            ".detach().cpu() copies.",
            step,
            when,
            subject=subject,
        )
        return Outcome(self.name, [subject], always, lambda _new: [alert])


__all__ = [
    "AllocRetries",
    "LeakTracker",
    "MemoryLeak",
    "MemoryPeak",
    "peak_rule",
    "retries_rule",
]
