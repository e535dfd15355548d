"""Hand a run on to the tools its users already run: TensorBoard, Weights & Biases, MLflow,
trackio, Prometheus (live), Parquet and CSV.

Live::

    mon = nbmonitor.attach(model, opt, export=["tensorboard", "prometheus"])
    mon = nbmonitor.attach(model, opt, export=[nbmonitor.export.TensorBoard(log_dir="tb")])

From disk, without torch::

    nbmonitor.open("runs/20240605-142233-MLP").export("tensorboard", log_dir="tb")
    nbmonitor export RUN --to wandb

Each exporter is a sink (``nbmonitor/sinks/<target>.py``) fed on the sampler side with the
rows the run log gets, or, from disk, with the run's rows read back in order. Its package is
imported only when it is used (extras ``tensorboard``, ``wandb``, ``mlflow``, ``trackio``,
``prometheus``, ``files``).
"""

from __future__ import annotations

import contextlib
import difflib
import os
import pathlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from nbmonitor.errors import ErrorLog, RunDirError
from nbmonitor.runs import Run as RunFiles
from nbmonitor.runs import Tail
from nbmonitor.runs.format import RunDataWarning
from nbmonitor.runs.layout import is_job, rank_dirs
from nbmonitor.runs.reader import run_path
from nbmonitor.sinks.base import Batch, Sink
from nbmonitor.sinks.exporter import ExportContext, Exporter, ExportError
from nbmonitor.sinks.files import CSV, Parquet
from nbmonitor.sinks.mlflow import MLflow
from nbmonitor.sinks.prometheus import Prometheus, endpoints
from nbmonitor.sinks.queued import Queued
from nbmonitor.sinks.tensorboard import TensorBoard
from nbmonitor.sinks.trackio import Trackio
from nbmonitor.sinks.wandb import WandB

# Each target by name: the exporter class made with the options given.
TARGETS: dict[str, type[Any]] = {
    "tensorboard": TensorBoard,
    "wandb": WandB,
    "mlflow": MLflow,
    "trackio": Trackio,
    "prometheus": Prometheus,
    "parquet": Parquet,
    "csv": CSV,
}
FROM_DISK = tuple(t for t in TARGETS if t != "prometheus")
# Exported from every rank of a job (each rank its own files); the others from one rank.
PER_RANK = frozenset({"tensorboard", "parquet", "csv"})
# Rows handed to the sinks in one batch when a run is read back from disk.
BATCH_ROWS = 2000
# The streams an exporter is given (spans are the timeline's, events are not scalars).
STREAMS = ("steps", "system", "layers", "events")

Progress = Callable[[int, int], None]
ExportSpec = str | Exporter


def exporter(target: ExportSpec, **options: Any) -> Exporter:
    """The exporter named ``target`` with ``options`` (or ``target`` itself, an exporter
    object). ValueError (one line, with the names) for an unknown name."""
    if not isinstance(target, str):
        if not isinstance(target, Exporter):
            raise TypeError(
                f"nbmonitor: export= takes target names or nbmonitor.export objects, not "
                f"{type(target).__name__}; choose from {', '.join(TARGETS)}"
            )
        if options:
            raise TypeError("nbmonitor: options go into the exporter object, not beside it")
        return target
    cls = TARGETS.get(target.lower())
    if cls is None:
        close = difflib.get_close_matches(target.lower(), TARGETS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"nbmonitor: unknown export target {target!r}; {hint}choose from {', '.join(TARGETS)}"
        )
    exp: Exporter = cls(**options)
    return exp


def exporters(export: ExportSpec | Sequence[ExportSpec] | None) -> list[Exporter]:
    """``attach(export=...)``'s value as exporters (checked at attach, before anything
    starts): a name, an exporter object, or a list of them; a target named twice is an
    error."""
    if export is None:
        return []
    items = [export] if isinstance(export, (str, Exporter)) else export
    if not isinstance(items, (list, tuple)):
        raise TypeError(
            f"nbmonitor.attach: export= takes a name, an exporter or a list of them, not "
            f"{type(export).__name__}"
        )
    out = [exporter(item) for item in items]
    names = [e.name for e in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"nbmonitor.attach: export= names {', '.join(twice)} more than once")
    return out


# Each target's name in a sentence ("MLflow export hung for 12 s").
TITLES = {"tensorboard": "TensorBoard", "wandb": "W&B", "mlflow": "MLflow", "csv": "CSV",
          "trackio": "trackio", "prometheus": "Prometheus", "parquet": "Parquet"}  # fmt: skip


def open_sinks(
    exps: Sequence[Exporter],
    context: ExportContext,
    errors: ErrorLog,
    retry_after: float | None = None,
) -> list[Sink]:
    """Each exporter's sink for a live run, behind its own bounded queue and worker thread
    (``sinks/queued.py``: a tool that stops answering holds up only itself); one that cannot
    start is reported in ``errors`` as ``export:<name>`` (one line) and left out: the run goes
    on without it."""
    sinks: list[Sink] = []
    for exp in exps:
        try:
            sink = exp.open(context)
            what = f"{TITLES.get(exp.name, exp.name)} export"
            sinks.append(Queued(sink, errors, what=what, retry_after=retry_after))
        except Exception as exc:
            exc.__traceback__ = None  # the line says it all; no file:line of ours
            errors.add(f"export:{exp.name}", exc)
    return sinks


def disk_context(run: RunFiles) -> ExportContext:
    """The export context of a run read from disk (a rank of a job: its place in it)."""
    meta = run.meta
    rank = meta.get("rank")
    rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else None
    world = meta.get("world_size")
    name = run.path.name if rank is None else f"{run.path.parent.name}/{run.path.name}"
    return ExportContext(
        name=name,
        run_dir=run.path,
        meta=meta,
        rank=rank,
        world_size=world if isinstance(world, int) and rank is not None else 1,
        live=False,
    )


def runs_of(path: str | os.PathLike[str]) -> list[pathlib.Path]:
    """The run folders at ``path``: the run itself, or every rank of a job."""
    folder = run_path(path)
    if is_job(folder):
        return [p for _, p in sorted(rank_dirs(folder).items())]
    return [folder]


def size(path: pathlib.Path, streams: Sequence[str] = STREAMS) -> int:
    """The bytes of the run's record files of ``streams`` (what a progress bar counts)."""
    files, total = RunFiles(path), 0
    for stream in streams:
        with contextlib.suppress(OSError):
            total += files.file(stream).stat().st_size
    return total


def batches(
    path: pathlib.Path, streams: Sequence[str] = STREAMS, rows: int = BATCH_ROWS
) -> Iterator[tuple[Batch, int, int]]:
    """The run's rows of ``streams``, as it is on disk now, in batches of at most ``rows``
    rows per stream (each stream oldest first), with the bytes read so far and in all (for a
    progress bar). Bounded memory: the files are read a slice at a time (``Tail``), a torn
    last line is left for later. ``Run.feed`` reads a run this way too, every stream."""
    total = size(path, streams)
    tail = Tail(path, streams=streams)
    while True:
        new = tail.poll()
        if not new:
            return
        done = min(total, sum(tail.offsets.values()))
        longest = max(len(r) for r in new.values())
        for start in range(0, longest, rows):
            part = {s: r[start : start + rows] for s, r in new.items()}
            yield Batch({s: r for s, r in part.items() if r}), done, total


@dataclass(frozen=True)
class Exported:
    """One run handed on: the run folder, the target and where it went."""

    run: pathlib.Path
    target: str
    where: str


def export_run(
    path: str | os.PathLike[str],
    to: ExportSpec,
    progress: Progress | None = None,
    **options: Any,
) -> list[Exported]:
    """Hand the run (or every rank of the job) at ``path`` on to ``to``, as it is on disk now
    (finished, or still being written). ``progress(done, total)`` is called as bytes of the
    run's files are read. Raises ExportError (one line) when the exporter cannot start or
    fails."""
    exp = exporter(to, **options)
    if exp.name == "prometheus":
        raise ExportError(
            "nbmonitor: Prometheus serves a live run (attach(export=['prometheus'])); "
            f"from disk choose one of {', '.join(FROM_DISK)}"
        )
    out = []
    folders = runs_of(path)
    for folder in folders:
        try:
            run = RunFiles(folder)
        except RunDirError as exc:
            if len(folders) == 1:
                raise
            # One unreadable rank of a job never costs the others.
            warnings.warn(RunDataWarning(f"{exc} Rank folder {folder.name} is left out."),
                          stacklevel=2)  # fmt: skip
            continue
        sink = exp.open(disk_context(run))
        status = run.status
        try:
            if not getattr(sink, "reads_folder", False):
                for batch, done, total in batches(folder):
                    sink.write(batch)
                    if progress is not None:
                        progress(done, total)
                sink.flush()
        except BaseException:
            sink.close({"status": "degraded"})
            raise
        sink.close({"status": "degraded" if status == "degraded" else "closed"})
        if progress is not None:
            total = size(folder)
            progress(total, total)
        out.append(Exported(folder, exp.name, _where(sink)))
    if not out and folders:
        raise ExportError(f"nbmonitor: no rank of the job at '{path}' could be read.")
    return out


def _where(sink: Sink) -> str:
    where = getattr(sink, "where", None)
    if isinstance(where, str):
        return where
    for attr in ("out", "root"):
        value = getattr(sink, attr, None)
        if isinstance(value, pathlib.Path):
            return str(value)
    run = getattr(sink, "run", None)
    for attr in ("dir", "url"):
        value = getattr(run, attr, None)
        if isinstance(value, str) and value:
            return value
    run_id = getattr(sink, "run_id", None)
    return f"run {run_id}" if isinstance(run_id, str) else sink.name


__all__ = [
    "CSV",
    "FROM_DISK",
    "PER_RANK",
    "TARGETS",
    "ExportContext",
    "ExportError",
    "Exported",
    "Exporter",
    "MLflow",
    "Parquet",
    "Prometheus",
    "TensorBoard",
    "Trackio",
    "WandB",
    "endpoints",
    "export_run",
    "exporter",
    "exporters",
    "open_sinks",
]
