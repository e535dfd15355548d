"""The sampler's work in short slices, with the GIL handed to the training thread between two.

Every torch call of the training loop releases the GIL and must take it back when it
returns. While the sampler runs Python, the training thread waits for it: CPython makes the
holder let go only after the switch interval (5 ms), so one tick of tens of milliseconds
held the loop for most of its length, one torch op after another. A sampler that stops
every ``size`` records and sleeps briefly lets the waiting thread in; the training thread
then waits at most about one slice per op.

The pause is a sleep, not ``time.sleep(0)``: that releases the GIL too, but the sampler often
takes it back before the waiting thread has been scheduled, and the waiter then sits out
another switch interval (measured in benchmarks/NOTES.md, "The sampler in slices"). The process-wide
``sys.setswitchinterval`` is the user's setting and is left alone. The sleep lasts as long as
the slice before it took (``Pause``): a loop step of a few torch ops would otherwise wait
for one slice at each op, the sampler taking the GIL back at every release; leaving it free
as long as it held it, the sampler takes at most about half of it while it works, and a step
of the loop meets about one slice.

Slices are counted in records (or rows), not timed, so that the bound is the same on any
machine and a test can count it. Outside a scheduled tick (``flush()``, ``close()``, where
the caller waits for the sampler) the work is cut the same way but nothing pauses.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

# The shortest and the longest hand-over. Linux wakes a sleeper no sooner than its timer slack
# (50 us by default), so shorter asks cost the same; the longest keeps a tick short in wall time
# whatever one slice cost (a garbage collection in it).
PAUSE_S = 50e-6
MAX_PAUSE_S = 2e-3
# The most records (or rows) one slice handles: 5-20 us each on the sampler thread (tiny to
# mlp20 of the benchmarks), so a slice stays under about a millisecond.
SLICE = 32


class Pause:
    """Sleeps for as long as the calling thread ran (its CPU time) since its last pause, from
    ``PAUSE_S`` to ``MAX_PAUSE_S``. One per thread that pauses (the sampler, the run log's
    worker)."""

    def __init__(
        self,
        cpu_clock: Callable[[], float] = time.thread_time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._cpu_clock = cpu_clock
        self._sleep = sleep
        self._last: float | None = None

    def __call__(self) -> None:
        now = self._cpu_clock()
        ran = 0.0 if self._last is None else now - self._last
        self._sleep(min(max(ran, PAUSE_S), MAX_PAUSE_S))
        self._last = self._cpu_clock()


class HandOver:
    """Cuts a tick's work into slices of at most ``size`` items and pauses between two while
    a scheduled tick runs (``scheduled()``). ``pause`` is injectable so that a test can count
    the work done between two hand-overs."""

    def __init__(self, size: int = SLICE, pause: Callable[[], None] | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self.pause = Pause() if pause is None else pause
        self._on = False

    @contextlib.contextmanager
    def scheduled(self) -> Iterator[None]:
        """Pause between slices for the duration (a scheduled tick, which nobody waits for)."""
        on, self._on = self._on, True
        try:
            yield
        finally:
            self._on = on

    @property
    def on(self) -> bool:
        """In a scheduled tick (which nobody waits for: it pauses between slices)."""
        return self._on

    def __call__(self) -> None:
        """Let the training thread in, during a scheduled tick."""
        if self._on:
            self.pause()

    def slices(self, items: Sequence[T]) -> Iterator[Sequence[T]]:
        """``items`` in order, ``size`` at a time, with a hand-over between two slices."""
        size = self.size
        for start in range(0, len(items), size):
            if start:
                self()
            yield items[start : start + size]
