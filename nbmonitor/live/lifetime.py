"""How a live monitor ends: by ``close()``, or by itself once its model is gone.

Ownership (what keeps what alive) is the point of this module. The model owns its monitor's
training-thread side (its hooks hold the step clock, which holds the probes and the model) and,
through ``registry.LIVE``, the Monitor; the Monitor holds the step clock only weakly. The
sampler thread holds the pipeline, the sinks and this ``Lifetime``, none of which holds the
model or the Monitor. So a model the user drops (re-running a cell that builds a new one) is
collected with everything it owns, and the run is then closed from a short-lived thread: by
the model's weakref callback while the Monitor is still referenced, or by the Monitor's
finaliser when it goes too. Releasing never runs on the thread that collected the garbage: it
can be the sampler itself, which cannot join itself.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from nbmonitor._capture.clock import StepClock
from nbmonitor._engine.session import Session


class StepCount:
    """The run's step count, its step clock (held weakly) and whether the run has closed:
    what the pipeline, the spans and the Monitor ask while the run lives. Built first, from
    the clock alone, so that everything built after it is complete when built."""

    def __init__(self, clock: StepClock) -> None:
        # The step clock while it lives, else None: a weak reference, so that asking
        # (Monitor.log, at every step) is one C call.
        self.clock: weakref.ref[StepClock] = weakref.ref(clock)
        # The clock's context (the step counter, the recorder; no model) outlives the clock,
        # so that the steps counted after the last look are still known once it is gone.
        self._ctx = clock.ctx
        self._last_step = clock.step
        self._last_ctx_step = clock.ctx.step
        self.start = clock.step  # the steps done before this run (attach's start_step)
        # The clock's hook handles (they hold no model): a global one (adopt.py) outlives it.
        self.handles = clock.handles
        self.closed = False

    def step(self) -> int:
        """Steps so far: the step clock's while it lives, then the last it counted."""
        clock = self.clock()
        if clock is not None:
            self._last_step, self._last_ctx_step = clock.step, self._ctx.step
            return self._last_step
        return self._last_step + self._ctx.step - self._last_ctx_step

    def phase(self) -> int | None:
        """The step phase the training thread is in now (``PhaseTimer.current``)."""
        clock = self.clock()
        return clock.phases.current() if clock is not None else None

    def remove_hooks(self) -> None:
        """Take the run's hooks out of the model and torch (the session's first step of
        closing)."""
        clock = self.clock()
        if clock is not None:
            clock.remove()
        for handle in self.handles:
            handle.remove()

    def counts(self) -> dict[str, object]:
        """What the final meta.json says of the steps."""
        step = self.step()
        # This run's steps: a resumed run (start_step) holds only those it took.
        return {"steps": step - self.start, "last_step": step}


class Lifetime:
    """How a live run ends: its step count and its session (``_engine/session.py``, which
    holds the pipeline, the sampler thread, the sinks and the backend), none of them the model
    or the Monitor; built complete by ``build.py``. The session closes the run; this says only
    what a live run adds: the step count closes first (the loop's records stop), and a run
    whose model went closes itself from a thread of its own."""

    def __init__(self, count: StepCount, session: Session) -> None:
        self.count = count
        self.session = session
        self.profile: Any = None  # the latest mon.profile() (live/profile.py)

    @property
    def closed(self) -> bool:
        return self.count.closed

    @property
    def stopped(self) -> bool:
        """A stop was asked for and applied: the run closes "stopped"."""
        return self.session.stopped

    @stopped.setter
    def stopped(self, value: bool) -> None:
        self.session.stopped = value

    @property
    def on_close(self) -> list[Callable[[], None]]:
        """Called first when the run closes (a profile still running stops its profiler)."""
        return self.session.on_close

    def step(self) -> int:
        return self.count.step()

    def clock(self) -> StepClock | None:
        return self.count.clock()

    def status(self) -> str:
        return self.session.status()

    def release_soon(self, *_: Any) -> None:
        """Close from a thread of its own (a weakref callback or a finaliser: any thread)."""
        if self.closed or sys.is_finalizing():
            return
        thread = threading.Thread(target=self.close, name="nbmonitor-release", daemon=True)
        thread.start()

    def close(self, wait: float = 5.0) -> None:
        """No more records from the loop, then the session's close (``Session.close``:
        idempotent, never raises, within ``wait`` seconds, interruptible)."""
        self.count.closed = True
        self.session.close(wait)


def current_cell() -> tuple[str, int] | None:
    """The notebook cell running now and its execution count, or None outside IPython. The
    cell is the front end's cell id (JupyterLab, Notebook 7 and VS Code send one with each
    execution), else the cell's text."""
    ipython = sys.modules.get("IPython")
    if ipython is None:  # not imported: not in IPython
        return None
    try:
        shell = ipython.get_ipython()
    except Exception:
        return None
    if shell is None:
        return None
    count = getattr(shell, "execution_count", 0)
    count = count if isinstance(count, int) else 0
    kernel = getattr(shell, "kernel", None)
    try:
        parent = kernel.get_parent() if kernel is not None else None
    except Exception:
        parent = None
    if isinstance(parent, dict):
        metadata = parent.get("metadata")
        cell_id = metadata.get("cellId") if isinstance(metadata, dict) else None
        if isinstance(cell_id, str) and cell_id:
            return f"id:{cell_id}", count
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    if history:
        return f"text:{history[-1]}", count
    return None
