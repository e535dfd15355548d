"""What ``nbmonitor top`` shows, as tables of cells (text and grade), built from a
DevicesFrame and the runs' rows: the one source of the TUI's tables, of ``--once`` and of the
text a snapshot saves. No terminal library here: ``plain()`` writes the tables as text; the
app styles the same cells by grade.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import DevicesFrame
from nbmonitor.ui.machine import fixed, gpu_rows, machine_values, rate, si_bytes

FloatArray = npt.NDArray[np.float64]
BLOCKS = "▁▂▃▄▅▆▇█"


class RunRowLike(Protocol):
    """A run as the table shows it (``nbmonitor.runs.watch.RunRow``)."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def total_steps(self) -> int | None: ...
    @property
    def loss(self) -> float: ...
    @property
    def samples_per_s(self) -> float: ...
    @property
    def tokens_per_s(self) -> float: ...
    @property
    def eta_s(self) -> float: ...
    @property
    def alerts(self) -> int: ...
    @property
    def last_alert(self) -> str: ...


class RunDetailLike(Protocol):
    """The selected run (``nbmonitor.runs.watch.RunDetail``)."""

    @property
    def row(self) -> RunRowLike: ...
    @property
    def series(self) -> Mapping[str, FloatArray]: ...
    @property
    def alerts(self) -> Sequence[Mapping[str, object]]: ...


@dataclass(frozen=True)
class Cell:
    text: str
    grade: str = "ok"  # "ok" | "warn" | "alert" | "none" | "dim" | "head"


@dataclass(frozen=True)
class Table:
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    empty: str = ""


def spark(
    values: Iterable[float], width: int, lo: float | None = None, hi: float | None = None
) -> str:
    """The last values as a sparkline of ``width`` characters (older values averaged into
    buckets when there are more than ``width``); a blank for no reading."""
    data = np.asarray(list(values), dtype=np.float64)
    if width <= 0 or not data.size:
        return ""
    if data.size > width:
        edges = np.linspace(0, data.size, width + 1).astype(int)
        with np.errstate(all="ignore"):
            data = np.array(
                [np.nanmax(data[a:b]) if np.isfinite(data[a:b]).any() else np.nan
                 for a, b in itertools.pairwise(edges)]
            )  # fmt: skip
    finite = data[np.isfinite(data)]
    if not finite.size:
        return " " * len(data)
    low = float(finite.min()) if lo is None else lo
    high = float(finite.max()) if hi is None else hi
    span = high - low
    out = []
    for v in data:
        if not math.isfinite(v):
            out.append(" ")
        elif span <= 0:
            out.append(BLOCKS[0])
        else:
            out.append(BLOCKS[int(min(max((v - low) / span, 0.0), 1.0) * (len(BLOCKS) - 1))])
    return "".join(out)


def _since(history: Mapping[str, FloatArray], since: float) -> Mapping[str, FloatArray]:
    times = history.get("time")
    if times is None or not math.isfinite(since):
        return history
    keep = times >= since
    return {k: v[keep] for k, v in history.items()}


def devices_table(frame: DevicesFrame, spark_width: int, since: float = -math.inf) -> Table:
    history = _since(frame.history, since)
    rows = []
    for gpu in gpu_rows(frame):
        v, g, p = gpu.values, gpu.grades, f"gpu{gpu.index}_"
        util = v.get("util_percent", math.nan)
        used, total = v.get("mem_used_bytes", math.nan), v.get("mem_total_bytes", math.nan)
        mem_hist = history.get(p + "mem_used_bytes", np.zeros(0))
        mem_spark = spark(mem_hist, spark_width, 0, total if math.isfinite(total) else None)
        rows.append(
            (
                Cell(str(gpu.index)),
                Cell(gpu.name.removeprefix("NVIDIA ")),
                Cell(fixed(util, "%")),
                Cell(spark(history.get(p + "util_percent", np.zeros(0)), spark_width, 0, 100)),
                Cell(f"{si_bytes(used)}/{si_bytes(total)}", g["mem_used_bytes"]),
                Cell(mem_spark, g["mem_used_bytes"]),
                Cell(fixed(v.get("temperature_c", math.nan), "C"), g["temperature_c"]),
                Cell(
                    f"{fixed(v.get('power_w', math.nan), '')}/"
                    f"{fixed(v.get('power_limit_w', math.nan), 'W')}"
                ),
                Cell(fixed(v.get("sm_clock_mhz", math.nan), "")),
                Cell(gpu.throttle or "-", g["throttle"]),
                Cell(str(len(gpu.processes))),
            )
        )
    header = ("GPU", "name", "util", "util hist", "memory", "mem hist", "temp", "power",
              "SM MHz", "clocks held by", "procs")  # fmt: skip
    return Table("Devices", header, tuple(rows), empty="no GPUs (NVML: see the notes)")


def drop_columns(table: Table, names: Iterable[str]) -> Table:
    """``table`` without the columns named (a narrow terminal, a one-shot print)."""
    drop = set(names)
    keep = [i for i, h in enumerate(table.header) if h not in drop]
    return Table(
        table.title,
        tuple(table.header[i] for i in keep),
        tuple(tuple(row[i] for i in keep) for row in table.rows),
        table.empty,
    )


def processes_table(frame: DevicesFrame, needle: str = "") -> Table:
    rows = []
    for gpu in gpu_rows(frame):
        for proc in gpu.processes:
            if needle and needle.lower() not in f"{proc.name} {proc.pid}".lower():
                continue
            rows.append(
                (Cell(str(gpu.index)), Cell(str(proc.pid)), Cell(proc.name),
                 Cell(si_bytes(proc.used_bytes)))
            )  # fmt: skip
    return Table("Processes", ("GPU", "pid", "name", "memory"), tuple(rows), "no GPU processes")


def machine_line(frame: DevicesFrame, spark_width: int, since: float = -math.inf) -> str:
    m = machine_values(frame)
    history = _since(frame.history, since)
    cpu = m.get("cpu_percent", math.nan)
    cpu_spark = spark(history.get("cpu_percent", np.zeros(0)), spark_width, 0, 100)
    return (
        f"CPU {fixed(cpu, '%')}{' ' + cpu_spark if cpu_spark else ''}"
        f"  RAM {si_bytes(m.get('ram_used_bytes', math.nan))}/"
        f"{si_bytes(m.get('ram_total_bytes', math.nan))}"
        f"  disk r {rate(m.get('disk_read_bytes_per_s', math.nan))}"
        f" w {rate(m.get('disk_write_bytes_per_s', math.nan))}"
        f"  net in {rate(m.get('net_recv_bytes_per_s', math.nan))}"
        f" out {rate(m.get('net_sent_bytes_per_s', math.nan))}"
    )


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _status_grade(status: str) -> str:
    return {
        "running": "ok",
        "closed": "dim",
        "stopped": "dim",
        "degraded": "warn",
        "killed": "alert",
    }.get(status, "warn")


def runs_table(rows: Sequence[RunRowLike], needle: str = "") -> Table:
    out = []
    for r in rows:
        if needle and needle.lower() not in f"{r.name} {r.status}".lower():
            continue
        step = f"{r.step}/{r.total_steps}" if r.total_steps else str(r.step)
        speed = (
            f"{r.tokens_per_s:.4g} tok/s" if math.isfinite(r.tokens_per_s)
            else f"{r.samples_per_s:.4g} smp/s" if math.isfinite(r.samples_per_s) else "-"
        )  # fmt: skip
        out.append(
            (
                Cell(r.name),
                Cell(r.status, _status_grade(r.status)),
                Cell(step),
                Cell("-" if not math.isfinite(r.loss) else f"{r.loss:.4g}"),
                Cell(speed),
                Cell(duration(r.eta_s)),
                Cell(str(r.alerts), "warn" if r.alerts else "ok"),
                Cell(r.last_alert or "", "warn" if r.last_alert else "dim"),
            )
        )
    header = ("run", "status", "step", "loss", "throughput", "ETA", "alerts", "last alert")
    return Table("Runs", header, tuple(out), empty="no runs in this folder")


def alerts_lines(frame: DevicesFrame, limit: int = 5) -> list[tuple[str, str]]:
    """The newest device alerts, newest first: (text, grade)."""
    alerts = list(frame.frame.alerts)[-limit:]
    return [
        (f"{time.strftime('%H:%M:%S', time.localtime(a.time)) if math.isfinite(a.time) else ''} "
         f"{a.message}", "alert" if a.severity == "error" else "warn")
        for a in reversed(alerts)
    ]  # fmt: skip


# The curves of a run's view: (key, label, scale, unit), each value shown with its unit.
DETAIL_SERIES = (
    ("loss", "loss", 1.0, ""),
    ("grad_norm", "grad norm", 1.0, ""),
    ("step_time", "step time", 1e3, " ms"),
)


def detail_lines(detail: RunDetailLike, width: int) -> list[tuple[str, str]]:
    """The selected run: its curves as sparklines with their latest, lowest and highest
    values, then its alerts, newest first."""
    r, series = detail.row, detail.series
    steps = series.get("step", np.zeros(0))
    span = f"steps {int(steps[0])}-{int(steps[-1])}" if len(steps) else "no steps yet"
    lines = [(f"{r.name}  {r.status}  step {r.step}  ({span})", "head")]
    for key, label, scale, unit in DETAIL_SERIES:
        values = series.get(key, np.zeros(0))
        finite = values[np.isfinite(values)] if len(values) else values
        if not finite.size:
            lines.append((f"{label:<10} -", "dim"))
            continue
        last, low, high = (
            f"{v * scale:.4g}{unit}" for v in (finite[-1], finite.min(), finite.max())
        )
        text = f"{label:<10} {last:<11} min {low:<11} max {high:<11} "
        lines.append((text + spark(values, max(width - len(text) - 1, 8)), "ok"))
    lines.append((f"alerts ({r.alerts})", "head"))
    for alert in reversed(detail.alerts):
        lines.append((f"step {alert.get('step', '?')}: {alert.get('message', '')}", "warn"))
    if not detail.alerts:
        lines.append(("none", "dim"))
    return lines


def plain(table: Table, width: int | None = None) -> str:
    """A table as aligned text (``--once``, snapshots)."""
    cells = [list(table.header)] + [[c.text for c in row] for row in table.rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(table.header))]
    lines = [table.title]
    for row in cells:
        line = "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
        lines.append(line[:width] if width else line)
    if not table.rows and table.empty:
        lines.append(table.empty)
    return "\n".join(lines)


def samples_csv(
    history: Mapping[str, FloatArray], first: tuple[str, ...] = ("time", "step")
) -> str:
    """Samples as CSV: one row per sample, the ``first`` columns first, then by name; empty
    for no reading."""
    keys = sorted(history, key=lambda k: (first.index(k) if k in first else len(first), k))
    n = min((len(v) for v in history.values()), default=0)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(keys)
    for i in range(n):
        row = [history[k][i] for k in keys]
        writer.writerow(["" if not math.isfinite(v) else repr(float(v)) for v in row])
    return buf.getvalue()


__all__ = [
    "Cell",
    "RunDetailLike",
    "RunRowLike",
    "Table",
    "alerts_lines",
    "detail_lines",
    "devices_table",
    "drop_columns",
    "machine_line",
    "plain",
    "processes_table",
    "runs_table",
    "samples_csv",
    "spark",
]
