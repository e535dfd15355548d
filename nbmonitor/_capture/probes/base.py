"""The Probe contract: one measurement taken on the training thread, behind its own Guard.

The step clock (``_capture/clock.py``) owns the model's and optimizer's root hooks and calls
each probe at the moments it declares (``EVENTS``); a probe may also install hooks of its own
(per-module forward hooks). A probe only records: it appends records to the Recorder and
returns. An exception from a probe is counted by its Guard and never reaches the loop, except
``NonFiniteError`` with ``on_nan="raise"``, which is the point of that mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle

    from nbmonitor._capture.device_value import DeviceValue, HostRing
    from nbmonitor._capture.recorder import Recorder
    from nbmonitor.errors import Guard
    from nbmonitor.records import NormLayout

# A step's gradient norms until the step ends: values, parameter index, layout (NormPass.take);
# on CUDA the values are the tuple of one _foreach_norm's results, crossed at the step's end
# (StepContext.cross); on the CPU the HostRing whose next row holds them.
PendingNorms = tuple[
    "DeviceValue | HostRing | tuple[torch.Tensor, ...] | None",
    "tuple[int, ...] | None",
    "NormLayout | None",
]
NO_NORMS: PendingNorms = (None, None, None)

# Sampled per-layer measurements (update ratios, activations, memory) are also taken on every
# one of the first EARLY_EVERY_STEP steps, then EARLY_PER_OCTAVE times each time the step count
# doubles (steps 10, 12, 14, 16; 20, 24, 28, 32; 40, ..., 96) up to EARLY_STEPS, while that is
# denser than `every`: a short run, or a bug present from the start, is measured well before
# the first `every`, and the extra sampling thins out as the run goes (a fixed number a
# doubling, not a block of every step), so a short run pays little more of it than a long one.
EARLY_EVERY_STEP = 8
EARLY_PER_OCTAVE = 4
EARLY_STEPS = 100


def _early_gap(step: int) -> int:
    """The spacing of early samples around ``step`` (> EARLY_EVERY_STEP): a power of two,
    ``EARLY_PER_OCTAVE`` of them in ``(2**k, 2**(k+1)]``."""
    return max(1, (1 << ((step - 1).bit_length() - 1)) // EARLY_PER_OCTAVE)


def due(step: int, every: int) -> bool:
    """Whether a measurement sampled every ``every`` steps is taken at ``step`` (1-based)."""
    if step <= EARLY_EVERY_STEP or step % every == 0:
        return True
    if step > EARLY_STEPS:
        return False
    gap = _early_gap(step)
    return gap < every and step % gap == 0


# A measurement that changes little from one early step to the next (the memory breakdown:
# parameters, gradients and optimizer state, which exist from the first step's end, and the
# activations of a batch) is taken on each of the first EARLY_DENSE_STEPS steps (the first
# forward's activations, the optimizer's state made by the first step and the second step's
# steady picture) and then every ``every``, as in a long run: a short run pays for the
# breakdown what a long one does (4 of a 200-step run's steps, where ``due`` takes 24). No
# health rule reads it; the memory panel and ``mon.memory()`` show the newest.
EARLY_DENSE_STEPS = 2


def due_thin(step: int, every: int) -> bool:
    """Whether ``step`` is taken by a thinner early schedule than ``due``'s (a subset of it, so
    that the clock, which calls sampled probes on the steps ``due`` takes, calls it then)."""
    return step <= EARLY_DENSE_STEPS or step % every == 0


def next_due(step: int, every: int) -> int:
    """The first step from ``step`` on that ``due(., every)`` takes."""
    if step <= EARLY_EVERY_STEP:
        return step
    regular = -(-step // every) * every
    if step > EARLY_STEPS:
        return regular
    gap = _early_gap(step)
    if gap >= every:
        return regular
    # The octave's last step is a multiple of its gap: the early step found stays in it (past
    # EARLY_STEPS it may not be due; the regular one then comes first or next_due looks on).
    early = -(-step // gap) * gap
    return min(regular, early) if early <= EARLY_STEPS else regular


# The moments of a step a probe can act at, in the order they happen.
EVENTS = ("forward_pre", "forward", "clip", "pre_step", "post_step")


@dataclass
class StepContext:
    """What the clock knows at a probe call: the step in progress and where records go."""

    recorder: Recorder
    step: int = 0  # optimizer steps completed
    micro: int = 0  # grad-enabled forwards in the step in progress
    # What the forward that just ran was given (set before the ``forward`` probes run).
    forward_samples: int = 0
    forward_tokens: int = 0
    # Set by the gradient-norm probe before the step; the clock puts it in the step's record.
    norms: PendingNorms = NO_NORMS
    # clip_grad_norm_ calls in the step in progress (``_capture/intercept.py``); the first
    # one's return value (the pre-clip total norm) and max_norm, kept while it is the only one.
    clips: int = 0
    clip_total: DeviceValue | None = None
    max_norm: float = math.nan
    # A probe whose work is done for the run (the FLOPs count) puts itself here; the clock
    # then stops calling it (three Python calls a step less for that one).
    retired: list[Probe] = field(default_factory=list)
    # How deferred norms cross at the step's end (NormPass.cross), set with them.
    cross: Callable[..., Any] | None = None

    def clip_ended(self, total: torch.Tensor, max_norm: object) -> None:
        """After a clip of the step's parameters; ``total`` is what it returned."""
        if self.clips == 1:
            from nbmonitor._capture.device_value import DeviceValue

            # As it is: DeviceValue reads a CPU scalar at once, and detaches and flattens
            # a device one itself (no reshape here: one torch call less a step).
            self.clip_total = DeviceValue(total)
            # A tensor max_norm would cost a sync to read: no clip coefficient then.
            self.max_norm = float(max_norm) if isinstance(max_norm, (int, float)) else math.nan
        else:
            # Several clips in one step (parameter groups clipped apart, or twice): the total
            # comes from the per-parameter norms taken before the first.
            self.clip_total = None

    @property
    def log_step(self) -> int:
        """The step a value recorded now belongs to (see ``StepClock.log_step``)."""
        return self.step + 1 if self.micro else self.step


class Probe(Protocol):
    """One measurement. ``name`` names its Guard (``probe:<name>`` in ``mon.errors``).

    A ``sampled`` probe acts only on the steps ``due(step, every)`` takes: the clock calls it
    on those steps alone (and the probe may check ``due`` again), so that the steps between
    cost it nothing, not even a call."""

    name: str
    guard: Guard
    sampled: bool
    every: int

    def events(self) -> tuple[str, ...]:
        """The moments (of ``EVENTS``) this probe acts at; the clock calls only those."""

    def install(self, model: torch.nn.Module) -> list[RemovableHandle]:
        """Hooks of its own (per-module ones), installed before the clock's root hooks."""

    def forward_pre(self, ctx: StepContext) -> None: ...

    def forward(self, ctx: StepContext, output: Any) -> None: ...

    def clip(self, ctx: StepContext) -> None:
        """As ``clip_grad_norm_`` starts (the first call in a step), before it clips."""

    def pre_step(self, ctx: StepContext) -> None: ...

    def post_step(self, ctx: StepContext) -> None: ...

    def close(self) -> None:
        """Undo what the probe left open beyond its hooks (a mode entered for a forward that
        raised); called once as the monitor removes its hooks."""


class ProbeBase:
    """Does nothing at every event; a probe overrides what it needs and lists it in events()."""

    name = "probe"
    sampled = False  # called at every step
    every = 1

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def events(self) -> tuple[str, ...]:
        return ()

    def install(self, model: torch.nn.Module) -> list[RemovableHandle]:
        return []

    def forward_pre(self, ctx: StepContext) -> None:
        return None

    def forward(self, ctx: StepContext, output: Any) -> None:
        return None

    def clip(self, ctx: StepContext) -> None:
        return None

    def pre_step(self, ctx: StepContext) -> None:
        return None

    def post_step(self, ctx: StepContext) -> None:
        return None

    def close(self) -> None:
        return None
