"""``nbmonitor top``: the terminal app (Textual). Devices with sparklines, graded against the
alert thresholds; the processes on each GPU; the machine; the runs under a folder with their
step, loss, throughput, ETA, status and alerts; the selected run's curves and alerts.

Keys: ``q`` quit, ``s`` save a snapshot of what is shown (text and samples CSV), ``r`` reset
the history the sparklines show, ``/`` filter runs and processes, arrows move, ``enter``
opens a run, ``escape`` goes back. Steering a running run (the one open, else the one
selected): ``p`` pause, ``u`` resume, ``c`` checkpoint, ``x`` stop (then ``y`` to confirm);
each is a request in the run's control folder, as ``nbmonitor ctl`` writes it (the ``steer``
callable the composition root gives), acted on at the run's next step boundary.

It reads a :class:`TopSource` once per interval on its event loop: the source does the
sampling and the reading (``nbmonitor/machine/top.py``).
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar, Protocol

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.widgets import Footer, Input, Static

from nbmonitor._atomic import write_atomic
from nbmonitor._engine.frame import DevicesFrame
from nbmonitor.ui.tui.tables import (
    RunDetailLike,
    RunRowLike,
    Table,
    alerts_lines,
    detail_lines,
    devices_table,
    drop_columns,
    machine_line,
    plain,
    processes_table,
    runs_table,
    samples_csv,
)

STYLES = {"ok": "", "warn": "yellow", "alert": "bold red", "none": "dim", "dim": "dim",
          "head": "bold"}  # fmt: skip
# Columns of the devices table left out below these terminal widths (80x24 over SSH).
NARROW = 120
# The statuses of a run that has ended (runs/status.py): ``tail --tui`` ends with it. A writer
# on another host that fell silent ("unknown") may come back: followed on.
ENDED = frozenset({"closed", "degraded", "stopped", "killed"})
NARROW_DROP = frozenset({"name", "SM MHz", "procs"})
VERY_NARROW = 90
VERY_NARROW_DROP = NARROW_DROP | {"power"}


class TopSource(Protocol):
    """What the app reads each interval: the machine (None until the first sample, or
    without a device watch), the runs (reading what they wrote since the last call), one
    run's detail."""

    interval: float

    def devices(self) -> DevicesFrame | None: ...

    def runs(self) -> Sequence[RunRowLike]: ...

    def detail(self, path: str) -> RunDetailLike | None: ...


def styled(table: Table, width: int, selected: int | None = None) -> Text:
    """A table as one styled Text (aligned columns, cut at ``width``; the ``selected`` row
    reversed). A Text costs far less to render each second than a Rich Table."""
    if not table.rows:
        return Text(table.empty, style="dim")
    widths = [len(h) for h in table.header]
    for row in table.rows:
        widths = [max(w, len(c.text)) for w, c in zip(widths, row, strict=True)]
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append("  ".join(h.ljust(w) for h, w in zip(table.header, widths, strict=True))[:width],
               style="bold")  # fmt: skip
    for i, row in enumerate(table.rows):
        out.append("\n")
        line = Text(no_wrap=True, overflow="ellipsis")
        for j, (cell, w) in enumerate(zip(row, widths, strict=True)):
            if j:
                line.append("  ")
            line.append(cell.text.ljust(w), style=STYLES.get(cell.grade, ""))
        line.truncate(width)
        if i == selected:
            line.stylize("reverse")
        out.append_text(line)
    return out


class TopApp(App[None]):
    """The terminal app over a :class:`TopSource`. ``run_path`` opens that run's view
    directly (``nbmonitor tail RUN --tui``)."""

    TITLE = "nbmonitor top"
    CSS = """
    Screen { layout: vertical; }
    #title { height: 1; background: $boost; }
    #main { height: 1fr; }
    #detail { height: 1fr; display: none; }
    #filter { display: none; height: 3; }
    .section { height: auto; text-wrap: nowrap; text-overflow: ellipsis; }
    #detail, #title { text-wrap: nowrap; text-overflow: ellipsis; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("s", "save", "save"),
        Binding("r", "reset", "reset history"),
        Binding("slash", "filter", "filter"),
        Binding("escape", "go_back", "back"),
        Binding("up", "move(-1)", "", show=False),
        Binding("down", "move(1)", "", show=False),
        Binding("enter", "open", "open run"),
        Binding("p", "steer('pause')", "pause"),
        Binding("u", "steer('resume')", "resume"),
        Binding("c", "steer('checkpoint')", "checkpoint"),
        Binding("x", "ask_stop", "stop"),
        Binding("y", "confirm_stop", "", show=False),
    ]

    def __init__(
        self,
        source: TopSource,
        *,
        run_path: str | None = None,
        save_dir: str | Path = ".",
        clock: Callable[[], float] = time.time,
        steer: Callable[[str, str], str] | None = None,
    ) -> None:
        super().__init__()
        # Asks a run (its path) for "pause", "resume", "checkpoint" or "stop"; says what it did
        # in one line. None: no steering keys act (a source that is not a live folder).
        self.steer = steer
        self.stop_asked: str | None = None  # the run a stop waits for "y" on
        self.said: list[str] = []  # what the steering keys said, newest last
        self.source = source
        self.save_dir = Path(save_dir)
        self.clock = clock
        self.since = -math.inf  # sparklines show samples from here (``r``)
        self.needle = ""
        self.selected: str | None = run_path
        self.only_run = run_path is not None
        self.frame: DevicesFrame | None = None
        self.rows: Sequence[RunRowLike] = ()
        self.detail: RunDetailLike | None = None
        self.refreshes = 0
        self.ended: str | None = None  # how the one run followed ended (``run_path``)
        self.saved: list[Path] = []
        self.cursor = 0  # the run row selected in the table
        # What each widget shows, to skip unchanged ones: (text, spans) or text.
        self._shown: dict[str, tuple[str, tuple[object, ...]] | str] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        with VerticalScroll(id="main"):
            yield Static(id="devices", classes="section")
            yield Static(id="processes", classes="section")
            yield Static(id="machine", classes="section")
            yield Static(id="alerts", classes="section")
            yield Static(id="runs", classes="section")
        yield Static(id="detail")
        yield Input(placeholder="filter runs and processes (enter to apply)", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        if self.only_run:
            self._show_detail(True)
        self.refresh_data()
        self.set_interval(self.source.interval, self.refresh_data)

    # -- data -----------------------------------------------------------------------------

    def refresh_data(self) -> None:
        """Read the source once and redraw."""
        self.frame = self.source.devices()
        if not self.only_run:
            self.rows = self.source.runs()
        if self.selected is not None:
            self.detail = self.source.detail(self.selected)
        self.refreshes += 1
        try:
            self._draw()
        except NoMatches:
            # The timer can fire once more while the app exits and its screen's widgets are
            # already gone (seen under load); there is nothing left to draw on.
            return
        if self.only_run and self.detail is not None and self.detail.row.status in ENDED:
            self.ended = self.detail.row.status  # drawn once more, then the app ends
            self.exit()

    def _spark_width(self) -> int:
        return max(6, min(40, self.size.width // 12))

    def _devices_table(self) -> Table | None:
        if self.frame is None:
            return None
        table = devices_table(self.frame, self._spark_width(), self.since)
        width = self.size.width
        if width < VERY_NARROW:
            return drop_columns(table, VERY_NARROW_DROP)
        return drop_columns(table, NARROW_DROP) if width < NARROW else table

    def _update(self, widget_id: str, content: Text | str) -> None:
        """Update a widget only when what it shows changed (a paused run, an idle GPU cost no
        rendering), and lay the screen out again only when its number of lines changed (the
        lines do not wrap)."""
        plain = content.plain if isinstance(content, Text) else content
        key = (plain, tuple(content.spans)) if isinstance(content, Text) else content
        if self._shown.get(widget_id) == key:
            return
        old = self._shown.get(widget_id)
        self._shown[widget_id] = key
        old_plain = old[0] if isinstance(old, tuple) else old
        lines = plain.count("\n")
        relayout = not isinstance(old_plain, str) or old_plain.count("\n") != lines
        self.query_one(f"#{widget_id}", Static).update(content, layout=relayout)

    def _draw(self) -> None:
        now = _dt.datetime.fromtimestamp(self.clock()).strftime("%H:%M:%S")
        frame = self.frame
        width = self.size.width
        host = f"{frame.host} · " if frame is not None else ""
        filt = f" · filter: {self.needle}" if self.needle else ""
        if self.only_run:
            self._update("title", f" nbmonitor tail · {self._run_title()} · {now}")
        else:
            title = f" nbmonitor top · {host}{now} · every {self.source.interval:g} s{filt}"
            self._update("title", title)
        if self.only_run or self.query_one("#detail", Static).display:
            self._draw_detail()
            return
        devices = self._devices_table()
        if frame is not None and devices is not None:
            self._update("devices", styled(devices, width))
            self._update("processes", styled(processes_table(frame, self.needle), width))
            self._update("machine", machine_line(frame, self._spark_width(), self.since)[:width])
            alerts = alerts_lines(frame)
            self._update(
                "alerts",
                Text("\n").join(Text(t[:width], style=STYLES[g]) for t, g in alerts)
                if alerts
                else Text("no device alerts", style="dim"),
            )
        shown = self.shown_runs()
        self.cursor = min(self.cursor, max(len(shown) - 1, 0))
        self._update("runs", styled(runs_table(shown), width, self.cursor))

    def _run_title(self) -> str:
        """``<run> · running · step 30/100`` for the one run followed."""
        if self.detail is None:
            return Path(self.selected or "").name or "?"
        row = self.detail.row
        total = f"/{row.total_steps}" if row.total_steps else ""
        return f"{row.name} · {row.status} · step {row.step}{total}"

    def shown_runs(self) -> list[RunRowLike]:
        """The runs the table shows (those the filter keeps), in order."""
        needle = self.needle.lower()
        return [r for r in self.rows if not needle or needle in f"{r.name} {r.status}".lower()]

    def _draw_detail(self) -> None:
        if self.detail is None:
            self._update("detail", Text(f"{self.selected}: not a run (yet)", style="dim"))
            return
        lines = detail_lines(self.detail, self.size.width - 2)
        self._update("detail", Text("\n").join(Text(t, style=STYLES.get(g, "")) for t, g in lines))

    def _show_detail(self, on: bool) -> None:
        self.query_one("#main").display = not on
        self.query_one("#detail").display = on

    # -- keys -----------------------------------------------------------------------------

    def action_move(self, delta: int) -> None:
        if self.query_one("#detail", Static).display:
            return
        self.cursor = min(max(self.cursor + delta, 0), max(len(self.shown_runs()) - 1, 0))
        self._draw()

    def action_open(self) -> None:
        shown = self.shown_runs()
        if self.only_run or not shown or self.query_one("#detail", Static).display:
            return
        self.selected = shown[min(self.cursor, len(shown) - 1)].path
        self.detail = self.source.detail(self.selected)
        self._show_detail(True)
        self._draw()

    def action_go_back(self) -> None:
        filt = self.query_one("#filter", Input)
        if filt.display:
            filt.display = False
            self.set_focus(None)
            return
        if self.only_run:
            return
        self.selected, self.detail = None, None
        self._show_detail(False)
        self._draw()

    def steered_run(self) -> RunRowLike | None:
        """The run the steering keys act on: the one open, else the one selected."""
        if self.query_one("#detail", Static).display or self.only_run:
            return self.detail.row if self.detail is not None else None
        shown = self.shown_runs()
        return shown[min(self.cursor, len(shown) - 1)] if shown else None

    def _say(self, line: str, error: bool = False) -> None:
        self.said.append(line)
        self.notify(line, severity="error" if error else "information")

    def action_steer(self, kind: str) -> None:
        """Ask the run for ``kind`` at its next step boundary."""
        self.stop_asked = None
        run = self.steered_run()
        if run is None:
            self._say("no run selected", error=True)
            return
        if self.steer is None:
            self._say("steering is not available here", error=True)
            return
        if run.status != "running":
            self._say(f"{run.name} is not running ({run.status})", error=True)
            return
        try:
            self._say(self.steer(run.path, kind))
        except Exception as exc:  # the app never dies of a key
            self._say(f"{run.name}: {kind} not asked: {exc}", error=True)

    def action_ask_stop(self) -> None:
        run = self.steered_run()
        if run is None or run.status != "running":
            self.action_steer("stop")  # says why not
            return
        self.stop_asked = run.path
        self._say(f"stop {run.name} after its current step? press y to confirm")

    def action_confirm_stop(self) -> None:
        run = self.steered_run()
        if self.stop_asked is None or run is None or run.path != self.stop_asked:
            self.stop_asked = None
            return
        self.action_steer("stop")

    def action_reset(self) -> None:
        self.since = self.clock()
        self._draw()

    def action_filter(self) -> None:
        filt = self.query_one("#filter", Input)
        filt.display = True
        filt.value = self.needle
        filt.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.needle = event.value.strip()
        self._draw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.set_focus(None)

    def snapshot_text(self) -> str:
        """What is shown, as text."""
        width = self.size.width
        if self.only_run or self.query_one("#detail", Static).display:
            if self.detail is None:
                return f"{self.selected}: not a run (yet)\n"
            return "\n".join(t for t, _ in detail_lines(self.detail, width)) + "\n"
        parts = []
        devices = self._devices_table()
        if self.frame is not None and devices is not None:
            parts += [
                plain(devices),
                plain(processes_table(self.frame, self.needle)),
                machine_line(self.frame, self._spark_width(), self.since),
                "Alerts\n" + ("\n".join(t for t, _ in alerts_lines(self.frame)) or "none"),
            ]
        parts.append(plain(runs_table(self.rows, self.needle)))
        return "\n\n".join(parts) + "\n"

    def snapshot_csv(self) -> str:
        """The samples behind what is shown: the device samples (since the last reset), or
        the selected run's steps."""
        if self.selected is not None and self.detail is not None:
            return samples_csv(self.detail.series, first=("step", "time"))
        if self.frame is None:
            return samples_csv({})
        history = self.frame.history
        times = history.get("time")
        if times is not None and math.isfinite(self.since):
            keep = times >= self.since
            history = {k: v[keep] for k, v in history.items()}
        return samples_csv(history)

    def action_save(self) -> None:
        stamp = _dt.datetime.fromtimestamp(self.clock()).strftime("%Y%m%d-%H%M%S")
        base = self.save_dir / f"nbmonitor-top-{stamp}"
        n = 1
        while base.with_suffix(".txt").exists():
            n += 1
            base = self.save_dir / f"nbmonitor-top-{stamp}-{n}"
        try:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            text, csv = base.with_suffix(".txt"), base.with_suffix(".csv")
            # Whole files only: a reader (or a crash halfway) never sees half a snapshot.
            write_atomic(text, self.snapshot_text().encode("utf-8"))
            write_atomic(csv, self.snapshot_csv().encode("utf-8"))
        except OSError as exc:
            self.notify(f"snapshot not saved: {exc.strerror or exc}", severity="error")
            return
        self.saved += [text, csv]
        self.notify(f"saved {text} and {csv.name}")


__all__ = ["TopApp", "TopSource", "styled"]
