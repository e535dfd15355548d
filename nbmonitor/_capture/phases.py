"""Step phases: where each step's time went (data wait, forward, backward, other, optimizer),
from the moments the step clock already sees.

The clock calls the ``PhaseTimer`` at each moment (a forward starts, a forward ends, the
backward pass ends, the optimizer starts, the step ends); the time between two marks goes to
the phase the pair of moments says (``_PHASE``), and at the step's end the sums go into the
step's record (``StepRecord.phases``). On the host (CPU, MPS) a mark reads the clock. On CUDA,
one step in ``DEVICE_EVERY`` is timed on the device: each mark records a timing event on the
current stream, and the sampler reads the intervals once the step's last event has completed
(``EventIntervals``): no synchronisation on the training thread, and those phases are the
device's time, not the time it took to queue the work. The other steps are timed on the host
clock (what queueing them took), so that a step costs no event: the time panel says which
steps were timed on the device.

The timer owns its state, and each method's usual case (the host clock, the guard on) is
written out in it. Once the timer is ``fast`` (the host clock, a step ended, the backward's end
learned, the guard on) the step clock writes a mark's usual case in its own hook instead of
calling the method (``last``, ``t``, ``sums``: one call less a mark, five a step).
"""

from __future__ import annotations

import collections
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nbmonitor._capture.backward_end import BackwardEnd
from nbmonitor._capture.device_value import FromValues
from nbmonitor._capture.inputs import first_tensor, output_loss
from nbmonitor.errors import Guard
from nbmonitor.records import PHASES

DATA, FORWARD, BACKWARD, OTHER, OPTIMIZER = range(len(PHASES))

# The most CUDA events one step keeps (a step has about five per micro-batch).
MAX_EVENTS = 1024
# On CUDA, the steps whose phases are timed with events (the device's time): every this many
# (steps 16, 32, ...); the others on the host clock, with no event (docs/time.md).
DEVICE_EVERY = 16

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


class EventIntervals(FromValues):
    """The phases of one step on a CUDA device: timing events, and the phase of each interval
    between consecutive ones; a ``Pending`` whose values are the seconds per phase."""

    __slots__ = ("_data", "_events", "_first", "_phases", "_spare", "_values")

    def __init__(
        self,
        events: Sequence[Any],
        phases: Sequence[int],
        first: bool = False,
        spare: collections.deque[Any] | None = None,
        data: float = 0.0,
    ) -> None:
        self._events = events
        self._phases = phases
        self._first = first  # the run's first step: no wait for data was seen
        # The wait for data before the first event, on the host clock (the step's first
        # event is recorded as its first forward starts: a step costs no event before).
        self._data = data
        # Where the events go back once read, for the timer to record again (its pool).
        self._spare = spare
        self._values: list[float] | None = None

    def ready(self) -> bool:
        events = self._events
        return not events or bool(events[-1].query())  # (none: read, and handed back)

    def wait(self) -> None:
        if self._events:
            self._events[-1].synchronize()

    def values(self) -> list[float]:
        if self._values is not None:
            return list(self._values)
        sums = [0.0] * len(PHASES)
        events = self._events
        sums[DATA] = self._data
        for i, phase in enumerate(self._phases):
            sums[phase] += events[i].elapsed_time(events[i + 1]) / 1000.0
        if self._first:
            sums[DATA] = math.nan
        self._values = sums
        if self._spare is not None:
            # Read once: the step's events are this record's alone (a step timed on the
            # device starts with an event of its own) and go back to be recorded again.
            self._spare.extend(events)
            self._events = ()
        return list(sums)


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
    clock. ``cuda`` times one step in ``device_every`` with CUDA events instead of ``clock``.
    """

    def __init__(
        self,
        guard: Guard,
        clock: Callable[[], float],
        cuda: bool = False,
        enabled: bool = True,
        new_event: Callable[[], Any] | None = None,
        device_every: int = DEVICE_EVERY,
    ) -> None:
        self.guard = guard
        self.enabled = enabled  # off: every call returns at once (attach(phases=False))
        self.clock = clock
        self._cuda = cuda
        # On CUDA, every device_every-th step is timed with events (0: on the host only).
        self.device_every = device_every if cuda and enabled else 0
        # The step in progress is timed with events (the first one too when every step is).
        self._device = self.device_every == 1
        # This step's marks are on the host clock and the timer is on: each method's usual
        # case then works in place (``last``, ``t``, ``sums``); false on a step timed with
        # events, and once the guard is off (seen at the next step's end at the latest).
        self.host = enabled and not self._device
        # ``host``, past the first step (so a mark was made: ``last`` >= 0) and with the
        # backward's end learned: every mark's usual case and step_end's, which the step clock
        # then writes out in its hooks (see _fast).
        self.fast = False
        self.last = -1  # the previous mark; -1 before the first forward
        self.t = 0.0  # when it was made (host clock)
        self.sums = [0.0] * len(PHASES)
        self._events: list[Any] = []
        self._phases: list[int] = []
        self._data = 0.0  # a step timed with events: its wait for data (host clock)
        # CUDA events the sampler has read, recorded again instead of making new ones (a new
        # event is a Python object and, at its first record, a cudaEventCreate): the sampler
        # appends, this thread pops.
        self._spare: collections.deque[Any] = collections.deque()
        self._new_event = new_event or _timing_event
        self._backward = BackwardEnd(self._backward_end, guard)
        self._ended = False  # a step has ended (before, the first step's data wait is unknown)
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
        # mark.
        self.learned = False

    @property
    def on_device(self) -> bool:
        """The step in progress is timed with CUDA events."""
        return self._device

    # -- the marks, one method each (the clock's hooks call them at every step) ---------------

    def forward_start(self) -> None:
        if self.host:
            t = self.clock()
            last = self.last
            if last >= 0:
                self.sums[_INTO_FORWARD_START[last]] += t - self.t
            self.t = t
            self.last = FORWARD_START
        else:
            self.mark(FORWARD_START)

    def forward_ended(self, output: Any, watch: bool) -> None:
        """Mark a forward's end; with ``watch``, watch its output for the backward's end (until
        the parameter that marks it is known)."""
        if self.host and self.learned:
            t = self.clock()
            last = self.last
            if last >= 0:
                self.sums[_INTO_FORWARD_END[last]] += t - self.t
            self.t = t
            self.last = FORWARD_END
            return
        self.mark(FORWARD_END)
        if watch and self.enabled and not self.learned and self.guard.on:
            try:
                loss = output_loss(output)
                self._backward.watch(loss if loss is not None else first_tensor(output))
            except Exception as exc:
                self._failed(exc)

    def optimizer_start(self) -> None:
        if self.host:
            t = self.clock()
            last = self.last
            if last >= 0:
                self.sums[_INTO_OPTIMIZER_START[last]] += t - self.t
            self.t = t
            self.last = OPTIMIZER_START
        else:
            self.mark(OPTIMIZER_START)

    def held_until(self, now: float) -> None:
        """The loop was held after the step's end until ``now`` (a pause, a checkpoint): the
        wait for the next batch starts now."""
        self.t = now

    def step_end(self, step: int, now: float) -> tuple[float, ...] | EventIntervals | None:
        """Mark the end of ``step`` (at ``now``, the clock's reading) and return its phases, for
        its record: seconds per phase, events the sampler reads, or None (none measured: the
        timer off, or no forward seen yet)."""
        last = self.last
        if self.host and self._ended and last >= 0 and self.guard.on:
            sums = self.sums
            sums[_INTO_END[last]] += now - self.t
            self.t = now
            self.last = END
            out = tuple(sums)
            sums[:] = PHASE_ZEROS
            if self.device_every and (step + 1) % self.device_every == 0:
                self.start_device()
            return out
        return self._step_end(step, now)

    def _step_end(self, step: int, now: float) -> tuple[float, ...] | EventIntervals | None:
        """``step_end`` off its usual case: the first step, a step timed with events, a step
        after the guard went off."""
        if not self.enabled:
            return None
        if not self.guard.on:
            # (a failure the marks did not see: BackwardEnd counts on this guard too)
            self.host = self.fast = False
            return None
        last = self.last
        self.mark(END, now)
        out: tuple[float, ...] | EventIntervals | None = None
        if self._device:
            events, phases = self._events, self._phases
            self._events, self._phases = [], []
            self._device = False
            self.host = self.guard.on  # the next step on the host clock, from now
            self.t = now
            if len(events) > 1 and last >= 0 and self.guard.on:
                out = EventIntervals(events, phases, not self._ended, self._spare, self._data)
                self._ended = True
            # else: a mark failed to record (counted): no phases for this step
        elif last >= 0 and self.guard.on:
            first, self._ended = not self._ended, True
            sums = self.sums
            self.sums = [0.0] * len(PHASES)
            if first:  # the first step starts at its forward: what it waited for is unknown
                sums[DATA] = math.nan
            out = tuple(sums)
        if self.device_every and (step + 1) % self.device_every == 0 and self.guard.on:
            self.start_device()
        self._fast()
        return out

    def start_device(self) -> None:
        """Time the next step with events, from its first mark on (a step without two events,
        a mark having failed, has no phases)."""
        self._device = True
        self.host = self.fast = False
        self._events, self._phases = [], []

    def _fast(self) -> None:
        self.fast = self.host and self._ended and self.learned and self.guard.on

    def mark(self, kind: int, now: float | None = None) -> None:
        """The moment ``kind`` happens now (``now``: a clock reading the caller took)."""
        if not self.enabled or not self.guard.on:
            return
        try:
            if self._device:
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
        self._fast()

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
        self._fast()

    def _param_landed(self, param: torch.Tensor) -> None:
        if self.host:  # mark(BACKWARD_END), written out: at every step
            # (Hooked once a backward has ended: a forward was marked before, last >= 0.)
            t = self.clock()
            self.sums[_INTO_BACKWARD_END[self.last]] += t - self.t
            self.t = t
            self.last = BACKWARD_END
        else:
            self.mark(BACKWARD_END)

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
        if not self._events:  # the step's first: where its first interval starts
            self._data = self.clock() - self.t  # the wait before it, on the host clock
            self._events.append(event)
        elif len(self._events) < MAX_EVENTS:
            self._phases.append(_PHASE[self.last][kind] if self.last >= 0 else OTHER)
            self._events.append(event)
        else:  # forwards without a step (grad-enabled evaluation): bounded, the rest "other"
            self._phases[-1] = OTHER
            self._events[-1] = event


_INTO_FORWARD_START = INTO[FORWARD_START]
_INTO_FORWARD_END = INTO[FORWARD_END]
_INTO_BACKWARD_END = INTO[BACKWARD_END]
_INTO_OPTIMIZER_START = INTO[OPTIMIZER_START]
_INTO_END = INTO[END]


def _timing_event() -> Any:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


__all__ = [
    "BACKWARD_END",
    "DEVICE_EVERY",
    "END",
    "FORWARD_END",
    "FORWARD_START",
    "INTO",
    "OPTIMIZER_START",
    "PHASE_ZEROS",
    "EventIntervals",
    "PhaseTimer",
]
