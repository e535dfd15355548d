"""Which thread a view's widget updates are sent from: the sampler's, or the kernel's main one.

Every widget update is a comm message on the kernel's IOPub channel. JupyterLab, Notebook 7,
VS Code and marimo render them whichever thread sent them. Colab does not: each output lives in
its own sandboxed iframe, and Colab's front end delivers a comm message to it only in the
context of the execution request that produced it (its parent header) while that cell's outputs
are live; updates sent from a background thread after the displaying cell finished are dropped
(googlecolab/colabtools#3373: a send from another, running cell does arrive). So on Colab the
dashboard sends from the main thread only (``MainThreadRoute``):

- while a training cell runs, the training loop itself sends the newest frame at a step
  boundary (the monitor adds ``pump`` to the step clock's ``step_listeners``): one attribute
  check per step, and a send at most once per sampler interval;
- while the main thread is idle (between cells, or a loop running in another thread), the
  sampler schedules ``pump`` on the kernel's asyncio event loop, which runs it on the main thread.

The route is chosen once per view: ``main`` on Colab, ``thread`` elsewhere, and the
``NBMONITOR_PUBLISH`` environment variable (``main`` or ``thread``) overrides it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable
from typing import Literal

Route = Literal["main", "thread"]
ENV = "NBMONITOR_PUBLISH"


def choose_route() -> Route:
    """``main`` on Colab (or when NBMONITOR_PUBLISH=main), else ``thread``."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("main", "thread"):
        return "main" if forced == "main" else "thread"
    return "main" if "google.colab" in sys.modules else "thread"


def _main_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on the main thread now (a kernel's, while a cell runs), if any."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class MainThreadRoute:
    """Hands updates to ``send`` on the main thread only, newest first: an update offered from
    another thread waits (replacing the one waiting) until ``pump`` runs on the main thread."""

    def __init__(self, send: Callable[[Callable[[], None]], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._pending: Callable[[], None] | None = None
        self._final = False  # the waiting update is the last one (a close): keep it
        self._scheduled = False
        self._loop = _main_loop()
        self.sent_on_main = 0  # updates sent by pump, for tests

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def offer(self, update: Callable[[], None], final: bool = False) -> None:
        """Run ``update`` now on the main thread, else keep it for the next ``pump``."""
        if threading.current_thread() is threading.main_thread():
            with self._lock:
                self._pending, self._final = None, False
            update()
            return
        with self._lock:
            if self._final and not final:
                return  # closed: a late publish must not replace the final state
            self._pending, self._final = update, final
            schedule = not self._scheduled and self._loop is not None
            self._scheduled = self._scheduled or schedule
        if schedule and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self.pump)
            except RuntimeError:  # the kernel's loop is closed: the next step boundary sends
                with self._lock:
                    self._scheduled = False

    def pump(self, *_: object) -> None:
        """Send the waiting update, if any; a no-op off the main thread. Never raises: it runs
        inside the training loop (a step listener) and on the kernel's event loop."""
        if self._pending is None or threading.current_thread() is not threading.main_thread():
            return
        with self._lock:
            update, self._pending, self._final = self._pending, None, False
            self._scheduled = False
        if update is None:
            return
        try:
            update()
            self.sent_on_main += 1
        except Exception:  # a front end that went away must not break the training loop
            pass
