"""Step phases: where each step's time went (data wait, forward, backward, other, optimizer),
from the moments the step clock already sees.

The clock calls ``PhaseTimer.mark`` at each moment (a forward starts, a forward ends, the
backward pass ends, the optimizer starts, the step ends); the time between two marks goes to
the phase the pair of moments says (``_PHASE``), and at the step's end the sums go out as one
``PhaseRecord``. On the host (CPU, MPS) a mark reads the clock; on CUDA it records a timing
event on the current stream, and the sampler reads the intervals once the step's last event
has completed (``EventIntervals``): no synchronisation on the training thread, and the phases
are the device's time, not the time it took to queue the work.
"""

from __future__ import annotations

import collections
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.hooks import RemovableHandle

from nbmonitor._capture.backward_end import BackwardEnd
from nbmonitor._capture.inputs import first_tensor, output_loss
from nbmonitor.errors import Guard
from nbmonitor.records import PHASES, Pending, PhaseRecord

DATA, FORWARD, BACKWARD, OTHER, OPTIMIZER = range(len(PHASES))

# The most CUDA events one step keeps (a step has about five per micro-batch).
MAX_EVENTS = 1024

PHASE_ZEROS = (0.0,) * len(PHASES)

# The moments a step is marked at.
END, FORWARD_START, FORWARD_END, BACKWARD_END, OPTIMIZER_START = range(5)

# The phase in progress after each mark, until the next one (the phase a rank of a stalled
# job is in, sampled by the sampler thread: ``PhaseTimer.current``).
_AFTER = (DATA, FORWARD, BACKWARD, OTHER, OPTIMIZER)

# _PHASE[previous mark][this mark]: the phase of the time between them. Pairs that a plain
# loop never makes (a forward end with no start) count as "other". A forward end followed by
# the optimizer (or the next forward) is a backward whose end was not seen.
_PHASE: tuple[tuple[int, ...], ...] = (
    # to: END       FORWARD_START FORWARD_END BACKWARD_END OPTIMIZER_START
    (OTHER, DATA, OTHER, BACKWARD, OTHER),  # from END
    (OTHER, FORWARD, FORWARD, BACKWARD, OTHER),  # from FORWARD_START
    (BACKWARD, BACKWARD, OTHER, BACKWARD, BACKWARD),  # from FORWARD_END
    (OTHER, DATA, OTHER, BACKWARD, OTHER),  # from BACKWARD_END
    (OPTIMIZER, OTHER, OTHER, OTHER, OTHER),  # from OPTIMIZER_START
)

# INTO[this mark][previous mark]: _PHASE by columns, so that a mark written out in the step
# clock's hooks (``PhaseTimer.host``) takes its column once, as a constant.
INTO: tuple[tuple[int, ...], ...] = tuple(
    tuple(row[kind] for row in _PHASE) for kind in range(len(_PHASE))
)


class EventIntervals:
    """The phases of one step on a CUDA device: timing events, and the phase of each interval
    between consecutive ones; a ``Pending`` whose values are the seconds per phase."""

    __slots__ = ("_events", "_first", "_phases", "_spare", "_values")

    def __init__(
        self,
        events: Sequence[Any],
        phases: Sequence[int],
        first: bool = False,
        spare: collections.deque[Any] | None = None,
    ) -> None:
        self._events = events
        self._phases = phases
        self._first = first  # the run's first step: no wait for data was seen
        # Where the events go back once read, for the timer to record again (its pool).
        self._spare = spare
        self._values: list[float] | None = None

    def ready(self) -> bool:
        return bool(self._events[-1].query())

    def wait(self) -> None:
        self._events[-1].synchronize()

    def values(self) -> list[float]:
        if self._values is not None:
            return list(self._values)
        sums = [0.0] * len(PHASES)
        events = self._events
        for i, phase in enumerate(self._phases):
            sums[phase] += events[i].elapsed_time(events[i + 1]) / 1000.0
        if self._first:
            sums[DATA] = math.nan
        self._values = sums
        if self._spare is not None:
            # Read once: the events inside the step are this record's alone (its first and
            # last are shared with the steps around it) and go back to be recorded again.
            self._spare.extend(events[1:-1])
            self._events = (events[0], events[-1])
        return list(sums)

    def floats(self) -> npt.NDArray[np.floating[Any]]:
        return self.array()

    def array(self) -> npt.NDArray[np.float64]:
        return np.array(self.values(), dtype=np.float64)

    def stack_alike(
        self, values: Sequence[Pending]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.floating[Any]] | None] | None:
        return None


class _AllHooks(RemovableHandle):
    """The handle of every hook a PhaseTimer installed, and of those it will install."""

    def __init__(self, timer: PhaseTimer) -> None:
        super().__init__(collections.OrderedDict())
        self._timer = timer

    def remove(self) -> None:
        self._timer.remove()


class PhaseTimer:
    """Sums the time between the marks of one step by phase (training thread only).

    Behind its own Guard (``probe:phases``): a failure here stops the phases, never the step
    clock. ``cuda`` times with CUDA events instead of ``clock``.
    """

    def __init__(
        self,
        guard: Guard,
        clock: Callable[[], float],
        cuda: bool = False,
        enabled: bool = True,
        new_event: Callable[[], Any] | None = None,
    ) -> None:
        self.guard = guard
        self.enabled = enabled  # off: every call returns at once (attach(phases=False))
        self.clock = clock
        self._cuda = cuda
        # Marks on the host clock, and the timer on: the step clock's hooks then mark in
        # place (``last``, ``t``, ``sums``), without a call to mark(); false once the guard
        # is off (seen at the next step's end at the latest).
        self.host = enabled and not cuda
        self.last = -1  # the previous mark; -1 before the first forward
        self.t = 0.0  # when it was made (host clock)
        self.sums = [0.0] * len(PHASES)
        self._events: list[Any] = []
        self._phases: list[int] = []
        # CUDA events the sampler has read, recorded again instead of making new ones (a new
        # event is a Python object and, at its first record, a cudaEventCreate): the sampler
        # appends, this thread pops.
        self._spare: collections.deque[Any] = collections.deque()
        self._new_event = new_event or _timing_event
        self._backward = BackwardEnd(self._backward_end, guard)
        self.ended = False  # a step has ended (before, the first step's data wait is unknown)
        # The backward's end: until one full backward has been seen, a hook on each forward's
        # output queues a callback for the end of the pass (~8 us a step); meanwhile every
        # trainable parameter says when its gradient lands, and the one that lands last takes
        # over, with one call a backward and nothing per forward (see install()).
        # Weakly: a model dropped before its first backward is freed at once.
        self._params: weakref.WeakValueDictionary[int, torch.nn.Parameter] = (
            weakref.WeakValueDictionary()
        )
        self._last_param: int | None = None
        self._learning: list[RemovableHandle] = []
        self._handles: list[RemovableHandle] = []
        # The parameter that marks the backward's end is known: a forward's end is then only a
        # mark (the step clock writes it out).
        self.learned = False

    def mark(self, kind: int, now: float | None = None) -> None:
        """The moment ``kind`` happens now (``now``: a clock reading the caller took)."""
        if not self.enabled or not self.guard.on:
            return
        try:
            if self._cuda:
                self._mark_event(kind)
            else:
                t = self.clock() if now is None else now
                if self.last >= 0:
                    self.sums[_PHASE[self.last][kind]] += t - self.t
                self.t = t
            self.last = kind
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.guard.failed(exc)
        self.host = self.host and self.guard.on

    def current(self) -> int | None:
        """The phase (index into ``PHASES``) the training thread is in now, as its last mark
        says; None before the first forward or with the phases off. Read from the sampler
        thread: one attribute read, nothing done on the training thread for it."""
        last = self.last
        return _AFTER[last] if self.enabled and self.guard.on and last >= 0 else None

    def install(self, model: torch.nn.Module | None) -> list[RemovableHandle]:
        """Hooks on the trainable parameters to learn which gradient lands last; the one
        handle returned removes every hook of this timer."""
        if not self.enabled or model is None:
            return []
        for p in model.parameters():
            if p.requires_grad and id(p) not in self._params:
                self._params[id(p)] = p
                hook = p.register_post_accumulate_grad_hook(self._landed)  # type: ignore[no-untyped-call]
                self._learning.append(hook)
        return [_AllHooks(self)]

    def remove(self) -> None:
        for h in self._learning + self._handles:
            h.remove()
        self._learning.clear()
        self._handles.clear()

    def _landed(self, param: torch.Tensor) -> None:
        self._last_param = id(param)

    def _learn(self) -> None:
        # After the first full backward: the parameter whose gradient landed last marks the
        # backward's end from now on.
        self.learned = True
        for h in self._learning:
            h.remove()
        self._learning.clear()
        last = self._params.get(self._last_param) if self._last_param is not None else None
        self._params.clear()
        if last is None:  # no gradient landed: keep watching each forward's output
            self.learned = False
            return
        hook = last.register_post_accumulate_grad_hook(self._param_landed)  # type: ignore[no-untyped-call]
        self._handles.append(hook)

    def _param_landed(self, param: torch.Tensor) -> None:
        if self.host:  # mark(BACKWARD_END), written out: at every step
            t = self.clock()
            last = self.last
            if last >= 0:
                self.sums[_INTO_BACKWARD_END[last]] += t - self.t
            self.t = t
            self.last = BACKWARD_END
        else:
            self.mark(BACKWARD_END)

    def forward_ended(self, output: Any, watch: bool) -> None:
        """Mark a forward's end; with ``watch``, watch its output for the backward's end (until
        the parameter that marks it is known)."""
        self.mark(FORWARD_END)
        if watch and self.enabled and not self.learned and self.guard.on:
            try:
                loss = output_loss(output)
                self._backward.watch(loss if loss is not None else first_tensor(output))
            except Exception as exc:
                self._failed(exc)

    def _backward_end(self) -> None:
        self.mark(BACKWARD_END)
        if not self.learned:
            try:
                self._learn()
            except Exception as exc:
                self._failed(exc)

    def _mark_event(self, kind: int) -> None:
        spare = self._spare
        event = spare.pop() if spare else self._new_event()
        event.record()
        if self.last < 0:
            self._events.append(event)
        elif len(self._events) < MAX_EVENTS:
            self._phases.append(_PHASE[self.last][kind])
            self._events.append(event)
        else:  # forwards without a step (grad-enabled evaluation): bounded, the rest "other"
            self._phases[-1] = OTHER
            self._events[-1] = event

    def step_end(self, step: int, now: float, put: Callable[[PhaseRecord], None]) -> None:
        """Mark the step's end and ``put`` the record of its phases (none before a forward)."""
        last = self.last
        if last < 0 or self._cuda or not self.ended:
            self.mark(END, now)
            if last >= 0 and self.enabled and self.guard.on:
                put(self._record(step))
            return
        if not self.host or not self.guard.on:
            # (a failure the hooks' marks did not see: BackwardEnd counts on this guard too)
            self.host = False
            return
        # mark(END) and _record() on the host clock, written out: at every step's end.
        sums = self.sums
        sums[INTO[END][last]] += now - self.t
        self.t = now
        self.last = END
        put(PhaseRecord(step, tuple(sums)))
        sums[:] = PHASE_ZEROS

    def _record(self, step: int) -> PhaseRecord:
        first, self.ended = not self.ended, True
        if self._cuda:
            events, phases = self._events, self._phases
            # The step's last event is where the next step's first interval starts.
            self._events, self._phases = events[-1:], []
            return PhaseRecord(step, EventIntervals(events, phases, first, self._spare))
        sums = self.sums
        self.sums = [0.0] * len(PHASES)
        if first:  # the first step starts at its forward: what it waited for is unknown
            sums[DATA] = math.nan
        return PhaseRecord(step, tuple(sums))


_INTO_BACKWARD_END = INTO[BACKWARD_END]


def _timing_event() -> Any:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


__all__ = [
    "BACKWARD_END",
    "END",
    "FORWARD_END",
    "FORWARD_START",
    "INTO",
    "OPTIMIZER_START",
    "PHASE_ZEROS",
    "EventIntervals",
    "PhaseTimer",
]
