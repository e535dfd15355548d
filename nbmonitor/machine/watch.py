"""``nbmonitor.devices()``: watch the machine without a model. The composition root of a
device watch: the machine backend, sampled by a run's session (``_engine/session.py``: its
pipeline with no training parts, its sampler thread, its bounded close), judged by a run's
device rules, optionally written to a run folder by a run's run log, shown by views of
``DevicesFrame`` (the notebook panel, ``nbmonitor top``).

No torch: ``nbmonitor top`` builds the same watch in a terminal. One watch per kernel from
``devices()``: calling it again closes the earlier one (each notebook's kernel has its own).
"""

from __future__ import annotations

import atexit
import datetime as _dt
import math
import os
import platform
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from nbmonitor._engine.frame import DevicesFrame, Frame, RunInfo
from nbmonitor._engine.pipeline import SINK_RETRY_S
from nbmonitor._engine.pipeline_parts import PipelineParts
from nbmonitor._engine.run_model import RunModel
from nbmonitor._engine.session import Session
from nbmonitor._engine.store import FloatArray, Store
from nbmonitor._version import __version__
from nbmonitor.backends.base import Backend
from nbmonitor.errors import ErrorLog
from nbmonitor.health import Health, Thresholds
from nbmonitor.health.rules.devices import DEVICE_RULES
from nbmonitor.sinks import FanOut, RunLogSink

# How much of the recent past a DevicesFrame carries, for sparklines and snapshots.
HISTORY_S = 300.0
# Samples kept at full resolution in memory (the run folder, if any, keeps every one): ~4.5 h
# at 1 Hz. Older samples fold into buckets, as in a run's store.
RECENT_SAMPLES = 16_384
CLOSE_WAIT_S = 5.0


class DevicesView(Protocol):
    """Something that shows the machine: ``publish`` each new DevicesFrame, ``close`` with
    the last one. Called from the sampler's view worker; never raises on purpose."""

    def publish(self, frame: DevicesFrame) -> None: ...

    def close(self, frame: DevicesFrame) -> None: ...


class _Feed:
    """The pipeline's one view: turns its Frames into DevicesFrames for the watch's views."""

    wants_detail = False  # sparklines come from the history, not from step-decimated series

    def __init__(self, watch: DeviceWatch) -> None:
        self._watch = weakref.ref(watch)

    def publish(self, frame: Frame) -> None:
        watch = self._watch()
        if watch is not None:
            devices = watch.devices_frame(frame)
            for view in watch.views:
                view.publish(devices)

    def close(self, frame: Frame) -> None:
        watch = self._watch()
        if watch is not None:
            devices = watch.devices_frame(frame)
            for view in watch.views:
                view.close(devices)


def _check_interval(interval: object) -> float:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(
            f"nbmonitor.devices: interval must be a number of seconds, not {interval!r}."
        )
    if not (math.isfinite(interval) and interval > 0):
        raise ValueError(f"nbmonitor.devices: interval must be > 0 seconds, got {interval!r}.")
    return float(interval)


class DeviceWatch:
    """A live watch of the machine's devices. Create it with :func:`devices`.

    A sampler thread (``nbmonitor-sampler``) samples every ``interval`` seconds, runs the
    device rules (temperature, memory pressure, throttling) and, with ``run_dir``, writes the
    samples and alerts to a run folder that ``nbmonitor.open`` replays like any run.
    """

    def __init__(
        self,
        *,
        interval: float = 1.0,
        run_dir: str | os.PathLike[str] | None = None,
        name: str = "devices",
        pcie: bool = False,
        thresholds: Thresholds | None = None,
        backend: Backend | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.interval = _check_interval(interval)
        if thresholds is not None and not isinstance(thresholds, Thresholds):
            raise TypeError("nbmonitor.devices: thresholds must be a nbmonitor.Thresholds.")
        if backend is None:
            from nbmonitor.backends.machine import MachineBackend

            backend = MachineBackend(pcie=pcie)
        self.backend = backend
        self.errors_log = ErrorLog()
        self.views: tuple[DevicesView, ...] = ()
        self._start = clock()
        health = Health(thresholds, rules=DEVICE_RULES)
        self.thresholds = health.thresholds
        self._runlog: RunLogSink | None = None
        if run_dir is not None:
            self._runlog = RunLogSink.create(run_dir, name, self._meta())
        self.name = self._runlog.path.name if self._runlog is not None else name
        sinks = FanOut(
            [self._runlog] if self._runlog is not None else [],
            self.errors_log,
            retry_after=SINK_RETRY_S,
        )
        # A watch can stay open for days: a store sized for it rather than for a run.
        system = Store(recent=RECENT_SAMPLES, buckets=4096)
        self._session = session = Session(
            PipelineParts(
                info=RunInfo(self.name, backend.name, None, len(backend.devices)),
                backend=backend,
                # A watch has no training steps: its "step" counts the samples taken, so that
                # an alert that cleared can fire again (rearm_steps samples later).
                current_step=lambda: len(system),
                health=health,
                sinks=sinks,
                errors=self.errors_log,
                clock=clock,
                interval=self.interval,
                model=RunModel(system=system),
            ),
            counts=lambda: {"steps": 0, "samples": len(system)},
        )
        self._pipeline = session.pipeline
        session.add_view(_Feed(self))

    def _meta(self) -> dict[str, object]:
        backend = self.backend
        return {
            "kind": "devices",  # a watch of the machine: system samples and alerts, no steps
            "backend": {"name": backend.name, "devices": list(backend.devices)},
            "versions": {"nbmonitor": __version__, "python": platform.python_version()},
            "platform": platform.platform(),
            "start_time": _dt.datetime.fromtimestamp(self._start, _dt.UTC).isoformat(),
            "start_timestamp": self._start,
            "attach": {"interval": self.interval},
        }

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> DeviceWatch:
        """Start sampling (``devices()`` does this)."""
        self._session.start()
        return self

    @property
    def closed(self) -> bool:
        """Whether the watch was closed (``close()``, or ``devices()`` called again)."""
        return self._session.closed

    def close(self) -> None:
        """Stop sampling, write the last samples, close the run folder and the views.
        Idempotent; never raises; waits at most a few seconds on a source that hangs."""
        self._session.close(CLOSE_WAIT_S)

    def __enter__(self) -> DeviceWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading ----------------------------------------------------------------------------

    @property
    def status(self) -> str:
        """``"running"``, ``"degraded"`` (see ``errors``) or ``"closed"``."""
        return self._session.status()

    @property
    def errors(self) -> list[str]:
        """What failed inside nbmonitor, newest last."""
        return self._session.errors

    @property
    def run_dir(self) -> Path | None:
        """The run folder the samples are written to (``run_dir=``), or None."""
        return self._runlog.path if self._runlog is not None else None

    def flush(self, timeout: float = 5.0) -> bool:
        """Take a sample, judge it and write it now; False if that did not finish in time."""
        return self._session.flush(timeout)

    def history(self) -> dict[str, FloatArray]:
        """Every sample kept in memory, by key (``time``, ``cpu_percent``,
        ``gpu0_util_percent``, ...), oldest first; older ones as bucket means."""
        return self._pipeline.model.system.history()

    def frame(self) -> DevicesFrame:
        """What the views show now (``TimeoutError`` while a hung source holds the sampler)."""
        return self.devices_frame(self._session.frame(detail=False))

    def devices_frame(self, frame: Frame) -> DevicesFrame:
        """What the devices panel shows, built from ``frame`` (``watch.frame()``)."""
        backend, system = self.backend, self._pipeline.model.system
        n = max(2, int(HISTORY_S / self.interval))
        history = {key: system.tail(key, n) for key in system.columns}
        processes = getattr(backend, "processes", None)
        t = self.thresholds
        return DevicesFrame(
            frame=frame,
            host=socket.gethostname(),
            interval=self.interval,
            processes=processes() if callable(processes) else (),
            history=history,
            thresholds={
                "temperature_c": t.temperature_c,
                "memory_fraction": t.memory_fraction,
                "idle_util_percent": t.idle_util_percent,
            },
            run_dir=str(self.run_dir) if self.run_dir is not None else None,
            notes=tuple(backend.notes),
        )

    # -- views ------------------------------------------------------------------------------

    def add_view(self, view: DevicesView) -> None:
        """Show this watch in ``view`` too (its ``publish`` is called on each refresh)."""
        if view not in self.views:
            self.views = (*self.views, view)
            if self.closed:
                view.close(self.frame())

    def panel(self) -> Any:
        """A notebook panel of this watch (display it anywhere); every panel shows the same
        feed."""
        from nbmonitor.ui.devices import DevicesDashboard

        panel = DevicesDashboard()
        self.add_view(panel)
        if not self.closed:
            panel.publish(self.frame())
        return panel

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.panel()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return (
            f"<nbmonitor.DeviceWatch {self.name!r} gpus={len(self.backend.devices)} "
            f"status={self.status!r}>"
        )


_current: DeviceWatch | None = None
_current_lock = threading.Lock()


def devices(
    *,
    interval: float = 1.0,
    run_dir: str | os.PathLike[str] | None = None,
    name: str = "devices",
    pcie: bool = False,
    thresholds: Thresholds | None = None,
    display: bool = True,
) -> DeviceWatch:
    """Watch every device of this machine live, no model needed.

    In a notebook a panel shows each GPU (utilisation, memory, temperature, power, clocks and
    throttle reasons, PCIe link, NVLink, the processes using it with their names) and the
    machine's and this kernel's CPU, RAM, disk and network I/O, with sparklines of the last
    minutes and the device alerts a run would raise. Elsewhere it samples silently: read it
    with ``.frame()`` or ``.history()``.

    Args:
        interval: seconds between samples, as for ``attach``.
        run_dir: a folder to record into (``<run_dir>/<stamp>-<name>/``, a run folder that
            ``nbmonitor.open`` replays and the exporters export); None records nothing.
        name: the run folder's name (with ``run_dir``).
        pcie: also read each GPU's PCIe throughput (blocks ~20 ms per GPU per sample).
        thresholds: the alert thresholds (``nbmonitor.Thresholds``), as for ``attach``.
        display: show the panel in the cell (notebook only).

    Calling it again closes the kernel's earlier watch. ``close()`` it to stop.

    >>> watch = nbmonitor.devices(interval=1.0)  # doctest: +SKIP
    """
    global _current
    watch = DeviceWatch(
        interval=interval, run_dir=run_dir, name=name, pcie=pcie, thresholds=thresholds
    )
    with _current_lock:
        earlier, _current = _current, watch
    if earlier is not None:
        earlier.close()
    watch.start()
    if display and "IPython" in sys.modules:
        from nbmonitor.ui.notebook import in_notebook

        if in_notebook():
            from nbmonitor.ui.devices import show_panel

            show_panel(watch.panel())
    return watch


@atexit.register
def close_all() -> None:
    """Close the kernel's watch (tests, and interpreter exit: its run folder then says
    "closed", not "killed"; a source that hangs costs the exit at most a few seconds)."""
    global _current
    with _current_lock:
        earlier, _current = _current, None
    if earlier is not None:
        earlier.close()


__all__ = ["DeviceWatch", "DevicesView", "close_all", "devices"]
