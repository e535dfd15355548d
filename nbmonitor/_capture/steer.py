"""Steering: requests to pause, resume, stop, checkpoint or change the learning rate, taken
from any thread and applied by the training thread at the next step boundary.

A request (``Steering.request``) comes from the dashboard, the TUI, Python (``mon.pause()``)
or a control file (``nbmonitor ctl``, read by the sampler); it is queued under a lock and
applied at the end of the next optimizer step (``StepClock.step_listeners``), never inside
forward or backward. The listener is in the clock's list only while a request is pending or
the run is paused: an unused run pays the clock's ``if self.step_listeners:`` and nothing else.

- pause: the training thread waits at the boundary (waking every ``WAKE_S`` to run ``pump``,
  if set, and to apply what came meanwhile: a checkpoint, an lr) until resume or stop.
- stop: ``stop_requested`` turns true; with ``stop_mode="raise"`` (a plain loop) ``on_stop``
  runs (the live entrance closes the run) and ``stop_error(step)`` (a ``StopTraining``) is
  raised out of ``optimizer.step()``, after the update. With ``"flag"`` nothing is raised: a
  framework's callback reads ``stop_requested``. Without an optimizer (backward passes as
  steps) the error is raised from the model's next forward, not from inside backward.
- checkpoint: the model's, optimizer's (and scheduler's) state and the step, saved with
  ``torch.save`` to a temporary file and moved into place (``os.replace``); or the user's
  ``on_checkpoint(path, step)``.
- lr: every param group's learning rate set to the value; a scheduler's ``base_lrs`` (and
  the groups' ``initial_lr``) scaled by the same factor, so that its schedule goes on from
  the new level.

Every request applied or refused becomes a ``SteerEvent`` that the sampler takes
(``take_events``) and writes to the run's events. Nothing here raises into the loop except the
requested stop; a request that cannot be applied is an event with ``ok=False``.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nbmonitor.errors import ErrorLog, StopTraining

if TYPE_CHECKING:
    from nbmonitor._capture.clock import StepClock

KINDS = ("pause", "resume", "stop", "checkpoint", "lr")
_NEVER = 2**63
# How often a paused training thread wakes to run ``pump`` and look at new requests.
WAKE_S = 0.1
# The most requests held and events kept for the sampler: a flood of requests from a control
# directory or a widget is bounded (the oldest events go first; new requests are refused).
MAX_PENDING = 64
MAX_EVENTS = 256


@dataclass(frozen=True)
class Request:
    kind: str
    value: object
    source: str
    at_step: int | None
    time: float


@dataclass(frozen=True)
class SteerEvent:
    """A request applied (``ok``) or refused, for the run's events: ``step`` is the boundary
    it was applied at (the steps completed), ``action`` the request's kind, ``value`` its
    value (the learning rate, the checkpoint's path), ``source`` who asked (``"python"``,
    ``"dashboard"``, ``"ctl"``, ``"tui"``), ``message`` one line for people."""

    step: int
    time: float
    action: str
    value: object
    source: str
    ok: bool
    message: str
    # A request that was taken, but not as asked (a job's request that reached this rank after
    # the step it named): a warning for people, not a refusal.
    late: bool = False


class Steering:
    """The steering of one run; ``request`` from any thread, applied on the training thread.

    ``paused``, ``stop_requested`` and ``last_step`` (the last boundary it acted at) are plain
    attributes, readable from any thread.
    """

    def __init__(
        self,
        clock: StepClock,
        errors: ErrorLog,
        *,
        model: torch.nn.Module | None = None,
        scheduler: Any = None,
        on_checkpoint: Callable[[Path, int], object] | None = None,
        checkpoint_dir: Path | None = None,
        stop_mode: str = "raise",
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = weakref.ref(clock)
        self._model = weakref.ref(model) if model is not None else None
        self._errors = errors
        self.scheduler = scheduler
        self.on_checkpoint = on_checkpoint
        self.checkpoint_dir = checkpoint_dir
        self.stop_mode = stop_mode
        # "clock": applied at the step clock's end of step (a listener while something is
        # pending); "caller": a framework's callback calls ``at_boundary`` at its own step end
        # (after its scheduler stepped and its step counted), ``use_framework``.
        self.boundary = "clock"
        # A distributed job's rank: a request with no step named goes to the whole job
        # (written to its folder with a step ahead, read back by every rank's sampler) when
        # ``route(kind, value, source)`` takes it (returns True).
        self.route: Callable[[str, object, str], bool] | None = None
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._pending: list[Request] = []
        # The first step any pending request is due at (0: the next boundary): a boundary
        # before it returns at once, without the lock (a torchrun request held for a step
        # ahead). Read unlocked: a request queued while a boundary reads it is taken at the
        # next boundary.
        self._due_at = _NEVER
        self._events: collections.deque[SteerEvent] = collections.deque(maxlen=MAX_EVENTS)
        self._wake = threading.Event()
        self._listening = False
        self._released = False
        self.paused = False
        self.stop_requested = False
        self.stopped_at: int | None = None  # the step a stop was applied at
        self.last_step = clock.step
        # Run by the paused training thread every WAKE_S (steerui's busy-kernel delivery).
        self.pump: Callable[[], None] | None = None
        # Called on the training thread when a stop is applied (the live entrance closes the
        # run there), then ``stop_error(step)`` is raised (stop_mode "raise").
        self.on_stop: Callable[[int], None] | None = None
        self.stop_error: Callable[[int], BaseException] = _stop_error
        self._stop_hook: Any = None

    # -- any thread ----------------------------------------------------------------------------

    def request(
        self,
        kind: str,
        value: object = None,
        *,
        source: str = "python",
        at_step: int | None = None,
    ) -> None:
        """Queue a request for the next step boundary (``at_step``: the boundary of that step,
        or the next one past it). Never raises and never blocks for long: a bad request is
        refused as an event (``check_request`` says why; ``Monitor`` checks its own at the
        call first)."""
        now = self._wall_clock()
        why = check_request(kind, value, at_step)
        if why is not None:
            self._event(kind, value, source, ok=False, message=why, when=now)
            return
        if kind == "lr":
            value = float(value)  # type: ignore[arg-type]
        route = self.route
        if route is not None and at_step is None and not self._released:
            try:
                if route(kind, value, source):
                    return
            except Exception as exc:  # acted on here alone, and said
                self._errors.add("steer", exc)
        with self._lock:
            if self._released:
                return
            if len(self._pending) >= MAX_PENDING:
                refused = True
            else:
                refused = False
                self._pending.append(Request(kind, value, source, at_step, now))
                self._due_at = min(self._due_at, 0 if at_step is None else at_step)
                self._listen()
        if refused:
            self._event(
                kind, value, source, ok=False, message="too many requests waiting", when=now
            )
            return
        self._wake.set()  # a paused training thread looks at once

    def refuse(self, action: str, message: str, *, source: str = "ctl") -> None:
        """Report a request that could not even be read (a control file refused)."""
        self._event(action, None, source, ok=False, message=message)

    def warn_late(self, action: str, message: str, *, source: str = "ctl") -> None:
        """Report a request taken at a later step than it named (a job's request read late by
        this rank): a warning in the run's events, not an error of nbmonitor's."""
        self._event(action, None, source, ok=False, message=message, late=True)

    def use_framework(self) -> None:
        """A framework's callback steers: it calls ``at_boundary`` at the framework's step end
        when ``waiting``, and reads ``stop_requested`` to set the framework's own stop flag
        (nothing is raised)."""
        with self._lock:
            self.stop_mode = "flag"
            self.boundary = "caller"
            self._unlisten()

    @property
    def waiting(self) -> bool:
        """Whether a request waits for a step's end or the run is paused (no lock: a
        framework's callback reads it at every step)."""
        return bool(self._pending) or self.paused

    @property
    def pending(self) -> int:
        """Requests waiting for a step boundary."""
        with self._lock:
            return len(self._pending)

    def take_events(self) -> list[SteerEvent]:
        """The events since the last call, oldest first (the sampler, each tick)."""
        events = self._events
        out: list[SteerEvent] = []
        while events:
            try:
                out.append(events.popleft())
            except IndexError:
                break
        return out

    def release(self) -> None:
        """The run closed: wake a paused training thread and forget the user's objects (the
        scheduler holds the optimizer, and with it the parameters)."""
        with self._lock:
            self._released = True
            self._pending.clear()
            self._due_at = _NEVER
            self._unlisten()
        self.paused = False
        self._wake.set()
        self.scheduler = None
        self.on_checkpoint = None
        self.pump = None
        self.route = None  # a closed rank no longer speaks for its job
        hook = self._stop_hook
        if hook is not None:
            self._stop_hook = None
            hook.remove()

    # -- the training thread ---------------------------------------------------------------------

    def _listen(self) -> None:
        # Under self._lock. The clock iterates a copy of its list: appending from another
        # thread is safe.
        if not self._listening and self.boundary == "clock":
            clock = self._clock()
            if clock is None:
                return
            clock.step_listeners.append(self.at_boundary)
            self._listening = True

    def _unlisten(self) -> None:
        # Under self._lock.
        if self._listening:
            self._listening = False
            clock = self._clock()
            if clock is not None:
                with contextlib.suppress(ValueError):
                    clock.step_listeners.remove(self.at_boundary)

    def at_boundary(self, step: int) -> None:
        """The end of step ``step`` (a step listener): apply what is due; while paused, wait
        here. Raises only the requested stop."""
        self.last_step = step
        if step < self._due_at and not self.paused:
            return  # nothing due yet
        stop = self._apply_due(step)
        try:
            while self.paused and not stop and not self._released:
                self._wake.wait(WAKE_S)
                self._wake.clear()
                pump = self.pump
                if pump is not None:
                    try:
                        pump()
                    except Exception as exc:
                        self._errors.add("steer", exc)
                stop = self._apply_due(step)
        except BaseException:
            # An interrupt (KeyboardInterrupt) while paused ends the pause with it.
            self.paused = False
            with self._lock:
                if not self._pending:
                    self._unlisten()
            raise
        with self._lock:
            if not self._pending and not self.paused:
                self._unlisten()
        if stop:
            self._stop(step)
            return
        # What was applied (a pause, a checkpoint) held the loop: that time is not the next
        # step's.
        clock = self._clock()
        if clock is not None:
            clock.held()

    def _apply_due(self, step: int) -> bool:
        """Apply the requests due at ``step``, in order; whether a stop was among them."""
        with self._lock:
            if not self._pending:
                return False
            # While paused every request is due at the step paused at: the ranks of a job
            # paused at one step act there together, whatever step a request named.
            paused = self.paused
            due = [r for r in self._pending if paused or r.at_step is None or r.at_step <= step]
            if not due:
                return False
            self._pending = [r for r in self._pending if r not in due]
            self._due_at = min(
                (r.at_step for r in self._pending if r.at_step is not None), default=_NEVER
            )
        stop = False
        for request in due:
            try:
                stop = self._apply(request, step) or stop
            except Exception as exc:  # never into the loop: an event says it failed
                self._errors.add("steer", exc)
                self._event(
                    request.kind,
                    request.value,
                    request.source,
                    ok=False,
                    message=f"{request.kind} failed: {type(exc).__name__}: {exc}",
                    step=step,
                )
        return stop

    def _apply(self, request: Request, step: int) -> bool:
        kind, source = request.kind, request.source
        if kind == "pause":
            if not self.paused:
                self.paused = True
                self._event(
                    kind, None, source, ok=True, message=f"paused at step {step}", step=step
                )
        elif kind == "resume":
            if self.paused:
                self.paused = False
                self._event(
                    kind, None, source, ok=True, message=f"resumed at step {step}", step=step
                )
        elif kind == "stop":
            self.paused = False
            self.stop_requested = True
            self.stopped_at = step
            self._event(kind, None, source, ok=True, message=f"stopped at step {step}", step=step)
            return self.stop_mode == "raise"
        elif kind == "checkpoint":
            path = self._checkpoint(request.value, step)
            self._event(
                kind, str(path), source, ok=True, message=f"checkpoint at step {step}", step=step
            )
        elif kind == "lr":
            value = float(request.value)  # type: ignore[arg-type]
            old = self._set_lr(value)
            self._event(
                kind,
                value,
                source,
                ok=True,
                message=f"learning rate {_lrs_text(old)} -> {value:g} at step {step}",
                step=step,
            )
        return False

    def _stop(self, step: int) -> None:
        clock = self._clock()
        on_stop = self.on_stop
        if on_stop is not None:
            try:
                on_stop(step)
            except Exception as exc:
                self._errors.add("steer", exc)
        error = self.stop_error(step)
        if clock is not None and clock.optimizer is None:
            # Backward passes are the steps: this boundary is inside autograd's engine (its
            # final callback), which must not be unwound; the model's next forward raises.
            model = self._model() if self._model is not None else None
            if model is not None and self._stop_hook is None:

                def raise_stop(module: torch.nn.Module, args: object) -> None:
                    hook, self._stop_hook = self._stop_hook, None
                    if hook is not None:
                        hook.remove()
                    raise error

                self._stop_hook = model.register_forward_pre_hook(raise_stop)
            return
        raise error

    # -- what the requests do --------------------------------------------------------------------

    def _checkpoint(self, value: object, step: int) -> Path:
        if isinstance(value, (str, os.PathLike)):
            path = Path(value)
        elif self.checkpoint_dir is not None:
            path = self.checkpoint_dir / f"step-{step}.pt"
        else:
            raise RuntimeError("no checkpoint folder (the run has none) and no path given")
        on_checkpoint = self.on_checkpoint
        if on_checkpoint is not None:
            # A framework's callback saves where the framework does, and says where.
            saved = on_checkpoint(path, step)
            return Path(saved) if isinstance(saved, (str, os.PathLike)) else path
        clock = self._clock()
        model = self._model() if self._model is not None else None
        if model is None:
            raise RuntimeError("the model is gone")
        state: dict[str, object] = {"model": model.state_dict(), "step": step}
        optimizer = clock.optimizer if clock is not None else None
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        scheduler = self.scheduler
        if scheduler is not None:
            state["scheduler"] = scheduler.state_dict()
        save_atomically(state, path)
        return path

    def _set_lr(self, value: float) -> list[float]:
        clock = self._clock()
        optimizer = clock.optimizer if clock is not None else None
        if optimizer is None:
            raise RuntimeError("no optimizer to set the learning rate of")
        return set_lr(optimizer, value, self.scheduler)

    def _event(
        self,
        action: str,
        value: object,
        source: str,
        *,
        ok: bool,
        message: str,
        step: int | None = None,
        when: float | None = None,
        late: bool = False,
    ) -> None:
        self._events.append(
            SteerEvent(
                self.last_step if step is None else step,
                self._wall_clock() if when is None else when,
                action,
                value,
                source,
                ok,
                message,
                late,
            )
        )


def check_request(kind: object, value: object, at_step: object = None) -> str | None:
    """Why a request cannot be taken (one line), or None."""
    if kind not in KINDS:
        return f"unknown request {kind!r}; use one of {', '.join(KINDS)}"
    if at_step is not None and (
        isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 0
    ):
        return f"at_step must be an int >= 0, got {at_step!r}"
    if kind == "lr":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"lr needs a number, got {value!r}"
        if not math.isfinite(value) or value < 0:
            return f"lr must be a finite number >= 0, got {value!r}"
    elif kind == "checkpoint":
        if value is not None and not isinstance(value, (str, os.PathLike)):
            return f"checkpoint path must be a str or os.PathLike, got {type(value).__name__}"
    elif value is not None:
        return f"{kind} takes no value, got {value!r}"
    return None


def set_lr(optimizer: torch.optim.Optimizer, value: float, scheduler: Any = None) -> list[float]:
    """Set every param group's learning rate to ``value``; a scheduler's ``base_lrs`` (and the
    groups' ``initial_lr``, and its ``_last_lr``) are scaled by each group's factor. Returns
    the groups' learning rates before."""
    old: list[float] = []
    for i, group in enumerate(optimizer.param_groups):
        lr = group.get("lr")
        before = float(lr) if lr is not None else math.nan
        old.append(before)
        if isinstance(lr, torch.Tensor):
            lr.fill_(value)
        else:
            group["lr"] = value
        factor = value / before if before and math.isfinite(before) else math.nan
        if "initial_lr" in group and math.isfinite(factor):
            group["initial_lr"] = group["initial_lr"] * factor
        if scheduler is not None:
            bases = getattr(scheduler, "base_lrs", None)
            if isinstance(bases, list) and i < len(bases):
                # A base of 0 (or an lr of 0 before) cannot be scaled: the new value is it.
                bases[i] = bases[i] * factor if math.isfinite(factor) else value
            last = getattr(scheduler, "_last_lr", None)
            if isinstance(last, list) and i < len(last):
                last[i] = value
    return old


def save_atomically(state: object, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, then moved into place: a reader
    (or a crash) never sees half a checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _stop_error(step: int) -> BaseException:
    return StopTraining(f"nbmonitor: training stopped at step {step}", step)


def _lrs_text(lrs: list[float]) -> str:
    distinct = sorted(set(lrs))
    return (
        f"{distinct[0]:g}" if len(distinct) == 1 else "[" + ", ".join(f"{x:g}" for x in lrs) + "]"
    )


__all__ = [
    "KINDS",
    "Request",
    "SteerEvent",
    "Steering",
    "check_request",
    "save_atomically",
    "set_lr",
]
