"""Steering messages that reach a kernel busy running the training loop in the cell.

A dashboard button sends a comm message on the kernel's shell channel. ipykernel hands shell
messages for the main shell to the main thread, between cells: while a cell runs a training
loop in the main thread, a "pause" would wait until the loop ended on its own. (A loop in a
background thread leaves the main thread idle, and the message arrives as any other.)

ipykernel 7 reads every shell message on its own thread (the shell channel thread) and routes
it to the main shell or to a *subshell*, a thread of its own with its own event loop (JEP 91).
It routes a comm message by asking the comm itself, ``comm._reply_subshell_for(data, default)``
(the subshell its last publish came from). ``route_steering`` wraps that method on the
dashboard's comm so that a steering message (``ui.steer_controls.is_steer_message``) goes to a
subshell of ours, created on the first one, whose thread calls the widget's handler while the
main thread is still running the cell; every other message goes where it went. So:

- nothing runs in the training thread, and an unused run pays nothing (not even at a step
  boundary); a paused training thread is resumed by the same route;
- no other shell request is touched: the next cell's ``execute_request``, completions, other
  widgets' messages are routed, ordered and run by the kernel as before;
- a subshell's handling of a message sets the kernel's process-wide parent header (the one a
  user's own threads print and display under) to the steering message: their output would
  then land under no cell. ``restore_parent`` puts back the one in force before, once the
  request is handed on, as ipykernel does itself after a comm message it handles in the main
  thread during an async cell.

Without it (ipykernel 6, or a kernel without subshells or the routing method) buttons act
between cells and in loops that run in a background thread; ``route_steering`` says False.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any

from nbmonitor.ui.steer_controls import is_steer_message

# One subshell for this kernel's steering messages, made on the first one (on the shell channel
# thread, which is the only one that may make subshells).
_LOCK = threading.Lock()
_SUBSHELL: list[str] = []


def _kernel() -> Any:
    """The running ipykernel, or None (no kernel, or not ipykernel)."""
    try:
        from ipykernel.kernelbase import Kernel
    except ImportError:
        return None
    if not Kernel.initialized():
        return None
    return Kernel.instance()


def _subshell(kernel: Any) -> str | None:
    """Our subshell's id, made now if it does not exist. On the shell channel thread only."""
    manager = kernel.shell_channel_thread.manager
    with _LOCK:
        if _SUBSHELL and _SUBSHELL[0] in manager.list_subshell():
            return _SUBSHELL[0]
        made = manager._create_subshell()  # noqa: SLF001 - the control request's own step
        _SUBSHELL[:] = [made]
        return str(made)


class SteeringRoute:
    """The routing of one dashboard comm's steering messages past the busy main thread."""

    def __init__(self, kernel: Any, original: Callable[[Any, Any], Any]) -> None:
        self._kernel = kernel
        self._original = original
        # The parent (identities, header) in force when the last steering message came in.
        self._parent: tuple[Any, Any] | None = None
        self.routed = 0  # steering messages sent to the subshell, for tests

    def __call__(self, data: Any, default: Any) -> Any:
        """ipykernel's ``_reply_subshell_for``: where this comm message goes. On the shell
        channel thread; never raises (a failure routes the message as ipykernel would)."""
        try:
            if is_steer_message(data):
                kernel = self._kernel
                # This thread never sets a parent: these read the process-wide fallback.
                ident = kernel._get_shell_context_var(kernel._shell_parent_ident)  # noqa: SLF001
                self._parent = (ident, kernel.get_parent("shell"))
                target = _subshell(kernel)
                self.routed += 1
                return target
        except Exception:
            pass
        return self._original(data, default)

    def restore_parent(self) -> None:
        """Put back the parent the subshell's handling replaced (see the module's docstring).
        Called on the subshell's thread once the request is handed on; never raises."""
        parent, self._parent = self._parent, None
        if parent is None or threading.current_thread() is threading.main_thread():
            return
        # In a context of its own: the process-wide parent goes back, while this thread's stays
        # the steering message's (its "idle" must not name the cell: a front end would take the
        # cell for done).
        with contextlib.suppress(Exception):
            contextvars.Context().run(self._kernel.set_parent, *parent, channel="shell")


def route_steering(comm: Any) -> SteeringRoute | None:
    """Route ``comm``'s steering messages to a subshell (see the module's docstring); None
    where the kernel cannot (they then arrive between cells). Never raises."""
    try:
        kernel = _kernel()
        if kernel is None or getattr(kernel, "shell_channel_thread", None) is None:
            return None
        original = getattr(comm, "_reply_subshell_for", None)
        if original is None or not callable(original):
            return None
        if isinstance(original, SteeringRoute):
            return original
        route = SteeringRoute(kernel, original)
        comm._reply_subshell_for = route  # noqa: SLF001 - ipykernel's routing hook
        return route
    except Exception:
        return None
