"""User spans: ``with mon.span("data"):`` and ``@mon.span("eval")``, timed on the host.

A span reads the host clock as it enters and as it exits and appends one ``SpanRecord``
(name, the step in progress, start, duration, nesting depth, thread) to the Recorder: a few
microseconds, no device call, so no synchronisation on CUDA (work a span queues on a GPU may
still be running when it exits; the step phases time the device). Nesting is tracked per
thread. Nothing here raises into the caller's code: a failure is counted by the span's Guard
(``probe:spans``) and the span is dropped.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar

from nbmonitor._capture.probes.base import StepContext
from nbmonitor.errors import Guard
from nbmonitor.records import SpanRecord

P = ParamSpec("P")
R = TypeVar("R")


class Owner(Protocol):
    """What a span timer asks its monitor: whether it has closed (then spans record nothing,
    since nobody drains the recorder any more)."""

    closed: bool


class SpanTimer:
    """The spans of one monitor: per-thread stacks of start times, and the record at exit."""

    def __init__(
        self,
        ctx: StepContext,
        guard: Guard,
        owner: Owner,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._ctx = ctx
        self._put = ctx.recorder.put
        self.guard = guard
        self._owner = owner
        self._clock = clock
        # Host clock to wall clock, taken once: a span costs one clock read at each end.
        self._offset = wall_clock() - clock()
        self._local = threading.local()
        self._main = threading.get_ident()

    def _stack(self) -> list[float]:
        local = self._local
        try:
            stack: list[float] = local.stack
        except AttributeError:
            stack = local.stack = []
        return stack

    def enter(self) -> None:
        try:
            self._stack().append(self._clock())
        except Exception as exc:
            self.guard.failed(exc)

    def exit(self, name: str) -> None:
        end = self._clock()
        try:
            stack = self._stack()
            if not stack:
                return
            start = stack.pop()
            if self._owner.closed or not self.guard.on:
                return
            thread = threading.get_ident()
            self._put(
                SpanRecord(
                    name,
                    self._ctx.step + 1,
                    start + self._offset,
                    end - start,
                    len(stack),
                    0 if thread == self._main else thread,
                )
            )
        except Exception as exc:
            self.guard.failed(exc)


class Span:
    """A named span: a context manager (``with mon.span("data"):``) and a decorator
    (``@mon.span("eval")``); reusable, re-entrant and nestable."""

    __slots__ = ("_timer", "name")

    def __init__(self, name: str, timer: SpanTimer | None) -> None:
        self.name = name
        self._timer = timer

    def __enter__(self) -> Span:
        if self._timer is not None:
            self._timer.enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.exit(self.name)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def spanned(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return fn(*args, **kwargs)

        return spanned

    def __repr__(self) -> str:
        return f"<nbmonitor span {self.name!r}>"


def check_span_name(name: Any) -> str:
    """The name of a span, or a one-line error saying what to pass."""
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"nbmonitor: span(name) needs a non-empty str, got {name!r}; "
            'e.g. with mon.span("data"): ...'
        )
    return name


__all__ = ["Span", "SpanTimer", "check_span_name"]
