"""``nbmonitor top`` and ``nbmonitor tail RUN --tui``: the terminal's composition root. A
device watch (``machine/watch.py``: the machine backend, a run's sampler and device rules) and a
:class:`~nbmonitor.runs.watch.RunsWatch` feed the terminal app (``ui/tui/app.py``), or, with
``--once`` or when the output is not a terminal, print the tables once. No torch.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from nbmonitor._engine.frame import DevicesFrame
from nbmonitor.health.alert import Alert
from nbmonitor.health.rules.devices import IDLE_WINDOW, idle_rule
from nbmonitor.machine.watch import DeviceWatch
from nbmonitor.runs.watch import RunDetail, RunRow, RunsWatch

TUI_HINT = "pip install 'nbmonitor[tui]' (Textual)"
IDLE_ALERTS_KEPT = 50


class IdleWhileTraining:
    """A run's ``gpu_idle`` rule (``health.rules.devices.idle_rule``), judged by the machine
    view: a GPU that a running run's process uses (NVML lists its pid, on this host) and that
    stayed idle over the last ``window`` samples while that run's steps advanced. One alert per
    episode, named after the run."""

    def __init__(self, threshold_percent: float, window: int = IDLE_WINDOW) -> None:
        self.threshold = threshold_percent
        self.window = window
        self.alerts: list[Alert] = []
        self._active: set[tuple[int, str]] = set()
        self._host = socket.gethostname()

    def judge(
        self,
        frame: DevicesFrame,
        runs: Sequence[RunRow],
        detail: Callable[[str], RunDetail | None],
    ) -> None:
        times = frame.history.get("time")
        if times is None or len(times) < self.window:
            return
        times = times[-self.window :]
        held: set[tuple[int, str]] = set()
        training = [r for r in runs if r.status == "running" and r.host == self._host and r.pid]
        for i, procs in enumerate(frame.processes):
            util = frame.history.get(f"gpu{i}_util_percent")
            pids = {p.pid for p in procs}
            for run in (r for r in training if r.pid in pids):
                series = detail(run.path)
                steps = series.series.get("step") if series is not None else None
                when = series.series.get("time") if series is not None else None
                if util is None or steps is None or when is None or len(steps) < 2:
                    continue
                # The run's step at each sample: NaN before its first row kept, its last step
                # after its last row (a run that stopped writing has not advanced).
                at = np.interp(times, when, steps, left=np.nan, right=float(steps[-1]))
                columns = {"step": at, "time": times, f"gpu{i}_util_percent": util[-self.window :]}
                found = idle_rule(columns, self.window, self.threshold, gpus=[i])
                key = (i, run.path)
                if not found:
                    continue
                held.add(key)
                if key not in self._active:
                    alert = found[0]
                    self.alerts.append(
                        dataclasses.replace(alert, message=f"{run.name}: {alert.message}")
                    )
                    del self.alerts[:-IDLE_ALERTS_KEPT]
        self._active = held


class TopFeed:
    """What the app reads: the device watch's newest frame (it publishes to this feed from
    its sampler) and the runs, read when the app asks."""

    wants_detail = False

    def __init__(
        self,
        runs: RunsWatch | None,
        interval: float,
        *,
        devices: bool = True,
        pcie: bool = False,
        watch: DeviceWatch | None = None,
    ) -> None:
        self.interval = interval
        self.runs_watch = runs
        self._frame: DevicesFrame | None = None
        self.watch = watch
        self._rows: Sequence[RunRow] = ()
        if self.watch is None and devices:
            self.watch = DeviceWatch(interval=interval, pcie=pcie)
        self.idle = (
            IdleWhileTraining(self.watch.thresholds.idle_util_percent)
            if self.watch is not None
            else None
        )
        if self.watch is not None:
            self.watch.add_view(self)
            self.watch.start()

    # DevicesView: called on the watch's view worker; the app reads the newest.
    def publish(self, frame: DevicesFrame) -> None:
        self._frame = frame

    def close(self, frame: DevicesFrame) -> None:
        self._frame = frame

    def devices(self) -> DevicesFrame | None:
        """The newest frame of the device watch, with the idle-while-training alerts."""
        frame = self._frame
        if frame is None or self.idle is None or self.runs_watch is None:
            return frame
        self.idle.judge(frame, self._rows, self.runs_watch.detail)
        if not self.idle.alerts:
            return frame
        alerts = (*frame.frame.alerts, *self.idle.alerts)
        alerts = tuple(sorted(alerts, key=lambda a: a.time if math.isfinite(a.time) else 0.0))
        return dataclasses.replace(frame, frame=dataclasses.replace(frame.frame, alerts=alerts))

    def runs(self) -> Sequence[RunRow]:
        self._rows = self.runs_watch.poll() if self.runs_watch is not None else ()
        return self._rows

    def detail(self, path: str) -> RunDetail | None:
        if self.runs_watch is None:
            return None
        if self.runs_watch.only:
            self.runs_watch.poll()  # the app shows only this run: it is read here, not in runs()
        return self.runs_watch.detail(path)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.close()


def once_text(feed: TopFeed, width: int = 200) -> str:
    """The tables as text, from one sample (``--once``, and output that is not a terminal)."""
    from nbmonitor.ui.tui.tables import (
        alerts_lines,
        devices_table,
        drop_columns,
        machine_line,
        plain,
        processes_table,
        runs_table,
    )

    parts = []
    if feed.watch is not None:
        # Two samples: rates (disk, network) are over the time between them.
        feed.watch.flush()
        time.sleep(min(feed.interval, 1.0))
        feed.watch.flush()
        frame = feed.watch.frame()
        parts += [
            # Two samples draw no history: the sparkline columns are left out.
            plain(drop_columns(devices_table(frame, 0), ("util hist", "mem hist")), width),
            plain(processes_table(frame), width),
            machine_line(frame, 0),
            "Alerts\n" + ("\n".join(t for t, _ in alerts_lines(frame)) or "none"),
        ]
    if feed.runs_watch is not None:
        parts.append(plain(runs_table(feed.runs()), width))
    return "\n\n".join(parts) + "\n"


def _interactive(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def steer_run(path: str, kind: str) -> str:
    """The TUI's steering keys: the request ``nbmonitor ctl`` writes into the run's control
    folder (``runs/control.py``), read by the run within a sampling interval and acted on at
    the end of its next step; what was done, in one line. ``OSError`` when it cannot be
    written (no control folder: not a live run's own folder)."""
    from nbmonitor.runs.control import write_request

    name = Path(path).name
    try:
        write_request(path, kind, source="tui")
    except FileNotFoundError:
        raise OSError(f"{name} takes no requests (no control/ folder)") from None
    return f"asked {name} to {kind} at the end of its next step"


def top(
    runs_dir: str,
    interval: float,
    *,
    once: bool = False,
    devices: bool = True,
    pcie: bool = False,
    save_dir: str = ".",
    out: TextIO | None = None,
) -> int:
    """``nbmonitor top``: the app, or the tables once (``once``, or not a terminal)."""
    out = out if out is not None else sys.stdout
    runs: RunsWatch | None = RunsWatch(runs_dir)
    if not Path(runs_dir).is_dir():
        print(f"nbmonitor top: no folder {runs_dir!r}; showing devices only.", file=sys.stderr)
        runs = None
    if once or not _interactive(out):
        feed = TopFeed(runs, interval, devices=devices, pcie=pcie)
        try:
            out.write(once_text(feed))
        finally:
            feed.stop()
        return 0
    try:
        from nbmonitor.ui.tui.app import TopApp
    except ImportError as exc:
        print(f"nbmonitor top needs Textual ({exc}); {TUI_HINT}, or use --once.", file=sys.stderr)
        return 2
    feed = TopFeed(runs, interval, devices=devices, pcie=pcie)
    try:
        TopApp(feed, save_dir=save_dir, steer=steer_run).run()
    finally:
        feed.stop()
    return 0


def tail_tui(run: str, interval: float, save_dir: str = ".", headless: bool = False) -> int:
    """``nbmonitor tail RUN --tui``: the app on one run's view, no devices, until the run ends
    (then one line says how) or ``q``. ``headless``: drawn on no terminal (tests)."""
    path = Path(run)
    if not (path / "meta.json").is_file():
        print(f"nbmonitor tail: {run!r} is not a run folder (no meta.json).", file=sys.stderr)
        return 2
    try:
        from nbmonitor.ui.tui.app import TopApp
    except ImportError as exc:
        print(f"nbmonitor tail --tui needs Textual ({exc}); {TUI_HINT}.", file=sys.stderr)
        return 2
    feed = TopFeed(RunsWatch(path, only=True), interval, devices=False)
    app = TopApp(feed, run_path=str(path), save_dir=save_dir, steer=steer_run)
    app.run(headless=headless)
    if app.ended is not None and app.detail is not None:  # the run ended, and so did the app
        row = app.detail.row
        print(f"nbmonitor tail: {row.name} {app.ended} at step {row.step}")
    return 0


__all__ = ["TopFeed", "once_text", "steer_run", "tail_tui", "top"]
