"""The sampler's work in short slices, with the GIL handed to the training thread between two.

Every torch call of the training loop releases the GIL and must take it back when it
returns. While the sampler runs Python, the training thread waits for it: CPython makes the
holder let go only after the switch interval (5 ms), so one tick of tens of milliseconds
held the loop for most of its length, one torch op after another. A sampler that stops
every ``size`` records and sleeps briefly lets the waiting thread in; the training thread
then waits at most about one slice per op.

The pause is a short sleep, not ``time.sleep(0)``: that releases the GIL too, but the sampler
often takes it back before the waiting thread has been scheduled, and the waiter then sits
out another switch interval (measured in docs/performance.md, issue 29). The process-wide
``sys.setswitchinterval`` is the user's setting and is left alone.

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

# How long a hand-over sleeps. Linux wakes a sleeper no sooner than its timer slack (50 us by
# default), so shorter asks cost the same; the waiting thread needs only to be scheduled.
PAUSE_S = 50e-6
# The most records (or rows) one slice handles: 5-20 us each on the sampler thread (tiny to
# mlp20 of the benchmarks), so a slice stays under about a millisecond.
SLICE = 32


def pause() -> None:
    time.sleep(PAUSE_S)


class HandOver:
    """Cuts a tick's work into slices of at most ``size`` items and pauses between two while
    a scheduled tick runs (``scheduled()``). ``pause`` is injectable so that a test can count
    the work done between two hand-overs."""

    def __init__(self, size: int = SLICE, pause: Callable[[], None] = pause) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self.pause = pause
        self._on = False

    @contextlib.contextmanager
    def scheduled(self) -> Iterator[None]:
        """Pause between slices for the duration (a scheduled tick, which nobody waits for)."""
        on, self._on = self._on, True
        try:
            yield
        finally:
            self._on = on

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
