"""Runs on disk: open a finished or running run, follow one another process writes, list runs.

The second composition root (beside ``monitor.py``): it reads ``runs/`` and fills the same
stores that a live run fills, so that the one ``FrameBuilder`` draws the same dashboard (curves,
layer heatmap, alerts) for a live run, a finished one and one being written elsewhere.
Importing it loads no torch.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbmonitor._engine.frame import (
    MAX_POINTS,
    Frame,
    Series,
    View,
)
from nbmonitor._engine.run_state import RunState
from nbmonitor._engine.store import Store
from nbmonitor.runs import Run as RunFiles
from nbmonitor.runs import RunDataWarning, RunDirError, Tail, list_runs

if TYPE_CHECKING:
    from nbmonitor.job import Job


class Run(RunFiles):
    """A run on disk, finished or still being written: its data, and the dashboard of it.

    Create it with :func:`nbmonitor.open`. ``history()``, ``system()``, ``events()``,
    ``layers()``, ``meta`` and ``status`` read the files (``nbmonitor.runs.Run``);
    ``dashboard()`` shows the run with the same dashboard as a live monitor, and
    ``dashboard(live=True)`` follows it while another process writes it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._follow: Follow | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def state(self) -> RunState:
        """The run as it is on disk now, in the stores the dashboard is drawn from."""
        state = RunState(self.meta, self.name)
        state.add_columns("steps", self.history())
        state.add_columns("system", self.system())
        state.add_columns("layers", self.layers())
        state.add_events(self.events())
        state.spans.add_spans(self.records("spans"))
        return state

    def export_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write this run's steps, phases and spans (every rank) as a Chrome/Perfetto trace
        JSON file at ``path``."""
        from nbmonitor.runs.trace import write_trace

        return write_trace(self.path, path)

    def frame(self, detail: bool = True) -> Frame:
        """What the dashboard shows of this run now."""
        return self.state().frame(self.status, detail)

    def dashboard(self, live: bool = False, interval: float = 1.0) -> Any:
        """The notebook dashboard of this run (display it, or leave it last in a cell).

        With ``live=True`` it follows the run while another process writes it, reading only
        the new records every ``interval`` seconds, until the run closes or ``stop()``.
        """
        from nbmonitor.ui.dashboard import Dashboard

        info = RunState(self.meta, self.name).info
        dashboard = Dashboard(self.name, info.backend, info.total_steps)
        if live:
            self.stop()
            self._follow = Follow(self.path, [dashboard], interval)
            self._follow.start()
        else:
            dashboard.close(self.frame())
        return dashboard

    def stop(self) -> None:
        """Stop following the run (``dashboard(live=True)``); idempotent."""
        if self._follow is not None:
            self._follow.stop()
            self._follow = None

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.dashboard()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"<nbmonitor.Run {self.name!r} status={self.status!r}>"


class Follow:
    """Reads the new records of a run every ``interval`` seconds on a daemon thread
    (``nbmonitor-tail``) and publishes frames to views, until the run closes or ``stop()``."""

    def __init__(
        self, path: str | os.PathLike[str], views: Sequence[View], interval: float = 1.0
    ) -> None:
        if not (isinstance(interval, (int, float)) and interval > 0):
            raise ValueError(f"nbmonitor.tail: interval must be > 0 seconds, got {interval!r}.")
        self.tail = Tail(path)
        self.views = tuple(views)
        self.interval = float(interval)
        self.state: RunState | None = None
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbmonitor-tail", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def refresh(self) -> bool:
        """Read what is new and publish a frame; True once the run has closed."""
        new = self.tail.poll()
        if self.state is None:
            self.state = RunState(self.tail.meta, Path(self.tail.path).name)
        self.state.add_rows(new)
        # A writer that died without closing (runs/tail.py, ``ended``) ends the follow too.
        closed = bool(self.tail.closed) or self.tail.ended is not None
        frame = self.state.frame("closed" if closed else "running")
        for view in self.views:
            if closed:
                view.close(frame)
            else:
                view.publish(frame)
        return closed

    def _run(self) -> None:
        while True:
            try:
                if self.refresh():
                    return
            except Exception as exc:  # a torn or vanished file must not kill the follower
                self.errors.append(f"{type(exc).__name__}: {exc}")
                del self.errors[:-20]
            if self._stop.wait(self.interval):
                return


def compare_series(
    runs: Iterable[str | os.PathLike[str] | Run] | str | os.PathLike[str],
    metric: str = "loss",
    points: int = MAX_POINTS,
) -> dict[str, Series]:
    """The ``metric`` of each run against its steps, decimated to about ``points`` points
    (spikes kept), by run name. ``runs`` is a folder of runs or an iterable of runs/paths;
    a run without the metric is left out."""
    if isinstance(runs, (str, os.PathLike)) and not (Path(runs) / "meta.json").exists():
        items: list[str | os.PathLike[str] | Run] = [row["path"] for row in list_runs(runs)]  # type: ignore[misc]
    elif isinstance(runs, (str, os.PathLike, Run)):
        items = [runs]
    else:
        items = list(runs)
    out: dict[str, Series] = {}
    for item in items:
        try:  # each run on its own: one unreadable run never costs the others
            run = item if isinstance(item, Run) else Run(item)
            columns = run.history()
        except RunDirError as exc:
            warnings.warn(RunDataWarning(f"{exc} Left out of the comparison."), stacklevel=2)
            continue
        if metric not in columns or "step" not in columns:
            continue
        store = Store()
        store.extend_columns({"step": columns["step"], metric: columns[metric]})
        x, y = store.series(metric, points)
        name = run.name if run.name not in out else str(run.path)
        out[name] = Series(x, y)
    return out


def compare(
    runs: Iterable[str | os.PathLike[str] | Run] | str | os.PathLike[str],
    metric: str = "loss",
    log: bool = False,
) -> Any:
    """One figure overlaying ``metric`` (default the loss) of several runs: a folder of runs,
    or runs/paths. Display it, or leave it last in a cell."""
    from nbmonitor.ui.compare import compare_figure

    lines = compare_series(runs, metric)
    if not lines:
        raise ValueError(f"nbmonitor.compare: none of the runs has a {metric!r} column.")
    return compare_figure(lines, metric, log=log)


def open(path: str | os.PathLike[str]) -> Run | Job:
    """Open a run directory (finished, or being written by another process); a job folder of
    several ranks opens as a ``nbmonitor.job.Job`` (its ranks, the cross-rank view)."""
    from nbmonitor.runs.layout import is_job

    if isinstance(path, (str, os.PathLike)) and is_job(os.fspath(path)):
        from nbmonitor.job import Job

        return Job(path)
    return Run(path)


def tail(path: str | os.PathLike[str], interval: float = 1.0, wait: float = 60.0) -> Any:
    """Follow a run another process is writing, until it closes.

    In a notebook, returns its live dashboard (leave it last in a cell, or display it), which
    reads only the new records every ``interval`` seconds. In a terminal, prints a status line
    every ``interval`` seconds and returns the number of steps once the run closes (as
    ``python -m nbmonitor tail RUN`` does). A run that does not exist yet is waited for up
    to ``wait`` seconds.
    """
    from nbmonitor.runs.layout import is_job
    from nbmonitor.ui.notebook import in_notebook

    if in_notebook():
        run = open(path) if is_job(path) else Run(path)
        return run.dashboard(live=True, interval=interval)
    return follow_in_terminal(path, interval, wait)


def follow_in_terminal(
    path: str | os.PathLike[str], interval: float = 1.0, wait: float = 60.0
) -> int:
    """The console view of a run being written, until it closes (or its writer is gone); the
    number of steps seen. A run that does not exist yet is waited for up to ``wait`` seconds
    (RunNotFoundError after that, or at once when its parent folder is missing too)."""
    from nbmonitor.runs.layout import is_job
    from nbmonitor.runs.tail import wait_for_run
    from nbmonitor.runs.text import printable
    from nbmonitor.ui.console import ConsoleView, console_logger

    if is_job(path):
        from nbmonitor.job import follow_job_in_terminal

        return follow_job_in_terminal(path, interval)

    view = ConsoleView(console_logger(install_handler=True), every=interval)
    follower = Follow(path, [view], interval)
    wait_for_run(follower.tail, wait, say=lambda m: print(printable(m), flush=True))
    try:
        while not follower.refresh():
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    state = follower.state
    return int(state.steps.last("step")) if state is not None and len(state.steps) else 0


__all__ = [
    "Follow",
    "Run",
    "RunState",
    "compare",
    "compare_series",
    "list_runs",
    "open",
    "tail",
]
