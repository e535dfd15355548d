"""Which monitors are live: by model (attaching again replaces), by notebook cell (running the
cell again replaces), and all of them (interpreter exit closes them: a script that ends without
``close()`` loses nothing it recorded)."""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Protocol

from nbmonitor.live.lifetime import current_cell


class Live(Protocol):
    def close(self) -> None: ...

    def stop_signal(self) -> None: ...


# The live monitor of each model. It is also what keeps a monitor nobody holds alive as long as
# its model (``nbmonitor.attach(model)`` as a statement); a Monitor holds its model only weakly,
# so the entry goes with the model (lifetime.py).
LIVE: weakref.WeakKeyDictionary[object, Live] = weakref.WeakKeyDictionary()
# The monitors each notebook cell attached, with the execution that did: re-running the cell
# replaces them (a new model each run would otherwise leave the last one's monitor running).
BY_CELL: dict[str, tuple[int, weakref.WeakSet[Live]]] = {}
ALL: weakref.WeakSet[Live] = weakref.WeakSet()
_atexit_registered = False


def _close_all() -> None:
    # At interpreter exit, before daemon threads are stopped: close() takes, checks and writes
    # what was recorded, and is bounded (a hung source costs its documented wait, not a hang).
    # The sampler of each is signalled first, so that they all stop while the first is closed.
    monitors = list(ALL)
    for monitor in monitors:
        monitor.stop_signal()
    for monitor in monitors:
        # close() never raises; an interrupt here ends only this wait.
        with contextlib.suppress(BaseException):
            monitor.close()


def replace(model: object, monitor: Live) -> None:
    """Close the monitor ``model`` had and those an earlier run of this cell attached; record
    ``monitor`` in their place (before it starts)."""
    previous = LIVE.get(model)
    if previous is not None:
        previous.close()
    cell = current_cell()
    if cell is not None:
        # Those of this run of the cell (two models in one cell) are kept.
        key, count = cell
        earlier = BY_CELL.get(key)
        if earlier is not None and earlier[0] != count:
            for old in list(earlier[1]):
                old.close()
            earlier = None
        if earlier is None:
            earlier = BY_CELL[key] = (count, weakref.WeakSet())
        earlier[1].add(monitor)
    LIVE[model] = monitor


def started(monitor: Live) -> None:
    global _atexit_registered
    ALL.add(monitor)
    if not _atexit_registered:
        atexit.register(_close_all)
        _atexit_registered = True


def closed(model: object | None, monitor: Live) -> None:
    if model is not None and LIVE.get(model) is monitor:
        del LIVE[model]
    ALL.discard(monitor)
