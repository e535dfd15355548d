"""Runs on disk: open a finished or running run, follow one another process writes, list runs.

The second composition root (beside ``monitor.py``): it reads ``runs/`` and fills the same
stores that a live run fills, so that the one ``FrameBuilder`` draws the same dashboard (curves,
layer heatmap, alerts) for a live run, a finished one and one being written elsewhere.
Importing it loads no torch.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nbmonitor._engine.assemble.layers import LayerStats, ParamInfo
from nbmonitor._engine.frame import (
    MAX_POINTS,
    Frame,
    FrameBuilder,
    FrameState,
    RunInfo,
    Series,
    View,
)
from nbmonitor._engine.store import Store
from nbmonitor.health.alert import Alert
from nbmonitor.runs import Run as RunFiles
from nbmonitor.runs import Tail, list_runs

GRAD_PREFIX = "grad_norm/"
PARAM_PREFIX = "param_norm/"
RATIO_PREFIX = "update_ratio/"
ALERT_FIELDS = ("rule", "severity", "message", "step", "time", "layers", "subject")


class RunState:
    """What a run on disk has said so far, in the stores the FrameBuilder reads."""

    def __init__(self, meta: Mapping[str, Any], name: str) -> None:
        self.meta = meta
        backend = meta.get("backend") or {}
        devices = backend.get("devices") if isinstance(backend, Mapping) else None
        attach = meta.get("attach") or {}
        total = attach.get("total_steps") if isinstance(attach, Mapping) else None
        self.info = RunInfo(
            name,
            str(backend.get("name", "?")) if isinstance(backend, Mapping) else "?",
            total if isinstance(total, int) else None,
            len(devices) if isinstance(devices, list) else 0,
        )
        self.steps = Store()
        self.system = Store()
        self.builder = FrameBuilder(self.info, self.steps, self.system)
        self.alerts: list[Alert] = []
        self._flags: dict[str, list[str]] = {}
        self._layers: LayerStats | None = None
        self._best_loss = math.nan
        self._last_sample: dict[str, float] = {}
        self._first_time = math.nan
        self._last_time = math.nan

    # -- input ---------------------------------------------------------------------------------

    def add_columns(self, stream: str, columns: Mapping[str, np.ndarray[Any, Any]]) -> None:
        """A whole stream read at once (``open``): columns, not rows."""
        if not columns or not len(next(iter(columns.values()))):
            return
        if stream == "steps":
            self.steps.extend_columns(columns)
            self._note_steps(columns.get("loss"), columns.get("time"))
        elif stream == "system":
            self.system.extend_columns(columns)
            self._last_sample = {k: float(v[-1]) for k, v in columns.items()}
        elif stream == "layers":
            self._add_layer_columns(columns)

    def add_rows(self, streams: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """New records of a run being written (``tail``), per stream."""
        steps = [r for r in streams.get("steps", ()) if isinstance(r.get("step"), (int, float))]
        if steps:
            self.steps.extend([_floats(r) for r in steps])
            self._note_steps(
                np.array([r.get("loss", math.nan) for r in steps], dtype=np.float64),
                np.array([r.get("time", math.nan) for r in steps], dtype=np.float64),
            )
        system = [_floats(r) for r in streams.get("system", ())]
        if system:
            self.system.extend(system)
            self._last_sample = system[-1]
        self.add_events(streams.get("events", ()))
        layers = [_floats(r) for r in streams.get("layers", ())]
        if layers:
            keys = sorted({k for r in layers for k in r})
            self._add_layer_columns(
                {k: np.array([r.get(k, math.nan) for r in layers], dtype=np.float64) for k in keys}
            )

    def add_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            try:
                alert = Alert(
                    rule=str(event["rule"]),
                    severity=str(event.get("severity", "info")),
                    message=str(event.get("message", "")),
                    step=int(event.get("step", 0)),
                    time=float(event.get("time", math.nan)),
                    layers=tuple(str(n) for n in event.get("layers", ()) or ()),
                    subject=str(event.get("subject", "run")),  # runs before subjects: "run"
                )
            except (KeyError, TypeError, ValueError):
                continue  # one bad record never costs the others
            self.alerts.append(alert)
            for layer in alert.layers:
                self._flags.setdefault(layer, []).append(alert.rule)

    def _note_steps(self, loss: Any, times: Any) -> None:
        if loss is not None and len(loss):
            finite = loss[np.isfinite(loss)]
            if finite.size:
                low = float(finite.min())
                self._best_loss = low if math.isnan(self._best_loss) else min(self._best_loss, low)
        if times is not None and len(times):
            finite = times[np.isfinite(times)]
            if finite.size:
                if math.isnan(self._first_time):
                    self._first_time = float(finite[0])
                self._last_time = float(finite[-1])

    def _add_layer_columns(self, columns: Mapping[str, np.ndarray[Any, Any]]) -> None:
        names = [k.removeprefix(GRAD_PREFIX) for k in columns if k.startswith(GRAD_PREFIX)]
        names += [
            k.split("/", 1)[1]
            for k in columns
            if k.startswith((PARAM_PREFIX, RATIO_PREFIX)) and k.split("/", 1)[1] not in names
        ]
        if self._layers is None:
            if not names:
                return
            infos = [ParamInfo(n, (), 0, "", "", True, True) for n in dict.fromkeys(names)]
            self._layers = LayerStats(infos, group_by="param")
        layers = self._layers
        known = {n: i for i, n in enumerate(layers.names)}
        steps = columns.get("step")
        if steps is None:
            return
        grads = [
            (known[n], columns[GRAD_PREFIX + n])
            for n in names
            if n in known and GRAD_PREFIX + n in columns
        ]
        if grads:
            rows = ~np.all([np.isnan(v) for _, v in grads], axis=0)
            norms = np.full((int(rows.sum()), len(layers.names)), np.nan)
            for i, values in grads:
                if i < norms.shape[1]:
                    norms[:, i] = values[rows]
            layers.add_grad_norm_rows(steps[rows].astype(int).tolist(), norms, None)
        for prefix, target in (
            (PARAM_PREFIX, layers.param_norm),
            (RATIO_PREFIX, layers.update_ratio),
        ):
            for name, i in known.items():
                column = columns.get(prefix + name)
                if column is not None:
                    finite = column[~np.isnan(column)]
                    if finite.size:
                        target[i] = finite[-1]

    # -- output --------------------------------------------------------------------------------

    def frame(self, status: str, detail: bool = True) -> Frame:
        step = int(self.steps.last("step")) if len(self.steps) else 0
        elapsed = self._last_time - self._first_time
        layers = self._layers
        state = FrameState(
            status=status,
            step=step,
            elapsed_s=elapsed if math.isfinite(elapsed) else 0.0,
            latest_sample=self._last_sample,
            alerts=self.alerts,
            extra_latest={"best_loss": self._best_loss},
            layers=(lambda: layers.frame(self._flags)) if layers is not None else None,
        )
        return self.builder.build(state, detail=detail)


def _floats(row: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
        elif value is None:
            out[key] = math.nan
    return out


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
        return state

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
        closed = bool(self.tail.closed)
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
        run = item if isinstance(item, Run) else Run(item)
        columns = run.history()
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


def open(path: str | os.PathLike[str]) -> Run:
    """Open a run directory (finished, or being written by another process)."""
    return Run(path)


def tail(path: str | os.PathLike[str], interval: float = 1.0) -> Any:
    """Follow a run another process is writing, until it closes.

    In a notebook, returns its live dashboard (leave it last in a cell, or display it), which
    reads only the new records every ``interval`` seconds. In a terminal, prints a status line
    every ``interval`` seconds and returns the number of steps once the run closes (as
    ``python -m nbmonitor tail RUN`` does).
    """
    from nbmonitor.ui.notebook import in_notebook

    if in_notebook():
        return Run(path).dashboard(live=True, interval=interval)
    return follow_in_terminal(path, interval)


def follow_in_terminal(path: str | os.PathLike[str], interval: float = 1.0) -> int:
    """The console view of a run being written, until it closes; the number of steps seen."""
    from nbmonitor.ui.console import ConsoleView, console_logger

    view = ConsoleView(console_logger(install_handler=True), every=interval)
    follower = Follow(path, [view], interval)
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
