"""A run on disk, finished or being written by another process, and several runs compared.

It reads ``runs/`` and fills the same stores that a live run fills, so that the one
``FrameBuilder`` draws the same dashboard (curves, layer heatmap, alerts) for a live run, a
finished one and one being written elsewhere. Importing it loads no torch.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from nbmonitor._engine.frame import MAX_POINTS, Frame, Series
from nbmonitor._engine.run_state import RunState
from nbmonitor._engine.store import Store
from nbmonitor.replay.follow import Follow, run_name
from nbmonitor.runs import Run as RunFiles
from nbmonitor.runs import RunDataWarning, RunDirError, list_runs
from nbmonitor.runs.format import STREAMS
from nbmonitor.sinks import Sink

# Rows per Batch when a run on disk is fed to sinks: about what a busy live tick hands them.
FEED_ROWS = 4096


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
        """The run's name: its folder's, ``<job>/rank<r>`` for a rank of a job."""
        return run_name(self.path)

    def state(self) -> RunState:
        """The run as it is on disk now, in the stores the dashboard is drawn from."""
        state = RunState(self.meta, self.name)
        state.add_columns("steps", self.history())
        state.add_columns("system", self.system())
        state.add_columns("layers", self.layers())
        state.add_events(self.records("events"))
        state.model.add_span_rows(self.records("spans"))
        state.add_memory(self.records("memory"))
        return state

    def feed(self, sink: Sink, rows_per_batch: int = FEED_ROWS) -> None:
        """Push this run's records through ``sink`` (any ``nbmonitor.sinks.Sink``, or a
        ``FanOut`` of several) as a live run's sampler does: ``write`` a ``Batch`` of at most
        ``rows_per_batch`` rows per stream (every stream of ``nbmonitor.runs.format.STREAMS``,
        each oldest first), ``flush`` after each, then ``close`` with the run's meta.json.
        The files are read a slice at a time, as ``run.export`` reads them. A sink's error
        reaches the caller (wrap it in a ``FanOut`` to count it instead)."""
        from nbmonitor.export import batches

        if not (isinstance(rows_per_batch, int) and rows_per_batch > 0):
            raise ValueError(f"Run.feed: rows_per_batch must be > 0, got {rows_per_batch!r}.")
        for batch, _, _ in batches(self.path, tuple(STREAMS), rows_per_batch):
            sink.write(batch)
            sink.flush()
        sink.close(dict(self.meta))

    def export_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write this run's steps, phases and spans (every rank) as a Chrome/Perfetto trace
        JSON file at ``path``."""
        from nbmonitor.runs.trace import write_trace

        return write_trace(self.path, path)

    def export(
        self, to: Any, progress: Callable[[int, int], None] | None = None, **options: Any
    ) -> list[Path]:
        """Hand this run, as it is on disk now, on to ``to``: ``"tensorboard"``, ``"wandb"``,
        ``"mlflow"``, ``"trackio"``, ``"parquet"``, ``"csv"`` (with that exporter's options,
        e.g. ``log_dir=`` or ``out=``) or an exporter object (``nbmonitor.export.*``). Returns
        where it went. Raises ``nbmonitor.export.ExportError`` (one line) if it cannot."""
        from nbmonitor.export import export_run

        return [Path(e.where) for e in export_run(self.path, to, progress, **options)]

    def to_pandas(self) -> dict[str, Any]:
        """This run's tables as pandas DataFrames: ``history``, ``system``, ``layers`` (as
        :meth:`history` reads them) and ``events``."""
        from nbmonitor.sinks.files import frames

        return frames(self)

    def to_parquet(self, out: str | os.PathLike[str]) -> list[Path]:
        """Write this run's tables as ``<out>/<table>.parquet`` (those with rows); the paths."""
        from nbmonitor.sinks.files import write_tables

        return write_tables(self, out, "parquet")

    def to_csv(self, out: str | os.PathLike[str]) -> list[Path]:
        """Write this run's tables as ``<out>/<table>.csv`` (those with rows); the paths."""
        from nbmonitor.sinks.files import write_tables

        return write_tables(self, out, "csv")

    def frame(self, detail: bool = True) -> Frame:
        """What the dashboard shows of this run now."""
        return self.state().frame(self.status, detail)

    def figure(self, *keys: str, log: bool = False) -> Any:
        """A bqplot Figure of these metrics of the run against the step (``mon.figure``)."""
        from nbmonitor.ui.figures import metrics_figure

        return metrics_figure(self.frame().series, keys, log=log)

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

    def _display_(self) -> Any:
        """What marimo shows for this object: the dashboard's anywidget (marimo renders
        anywidgets, not the ipywidgets view in ``_repr_mimebundle_``)."""
        return self.dashboard()._display_()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.dashboard()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"<nbmonitor.Run {self.name!r} status={self.status!r}>"


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
    or runs/paths. Display it, or leave it last in a cell. One line per run, decimated like
    the dashboard's; ``nbmonitor.replay.compare_series`` gives the same as data; ``log=True``
    draws a log scale. ValueError when no run has the column."""
    from nbmonitor.ui.compare import compare_figure

    lines = compare_series(runs, metric)
    if not lines:
        raise ValueError(f"nbmonitor.compare: none of the runs has a {metric!r} column.")
    return compare_figure(lines, metric, log=log)


__all__ = ["Run", "compare", "compare_series"]
