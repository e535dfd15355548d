"""What an exporter is: a spec the user names or builds (``"tensorboard"``,
``nbmonitor.export.TensorBoard(log_dir=...)``) that opens a :class:`~nbmonitor.sinks.base.Sink`
for one run, live (at attach, on the main thread) or from disk (a run read back).

``open`` runs where the run starts, so an exporter captures there what is per thread (the
active W&B run, MLflow's active run); everything after (``write``, ``flush``, ``close``) runs
on the sampler side, behind the sink's Guard. An exporter's package is imported in ``open``
only, so a missing one costs nothing until it is asked for, and then says which extra to
install. No torch.
"""

from __future__ import annotations

import math
import pathlib
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from nbmonitor.sinks.base import Sink

# Where each numeric stream's keys go in a tool that has one namespace (W&B, MLflow, trackio,
# TensorBoard's runs): ``train/loss``, ``system/gpu0_power_w``, ``layers/grad_norm/fc.weight``.
PREFIX: dict[str, str] = {"steps": "train", "system": "system", "layers": "layers"}
# The step axis nbmonitor logs every key against (W&B's define_metric).
STEP_KEY = "nbmonitor/step"
# Columns that place a row, not values to export (``phase``: where in its step a rank of a job
# was when the system sample was taken).
PLACE = frozenset({"step", "time", "phase"})


@dataclass(frozen=True)
class ExportContext:
    """The run an exporter opens for: its name, folder and meta.json, and its place in a job.

    ``live``: a monitor is attached (False: a run read back from disk). ``uuids``: the GPUs'
    UUIDs by index where known (Prometheus labels its device series with them, as DCGM does).
    """

    name: str
    run_dir: pathlib.Path | None
    meta: Mapping[str, object] = field(default_factory=dict)
    rank: int | None = None
    world_size: int = 1
    live: bool = True
    uuids: Sequence[str] = ()

    @property
    def host(self) -> str:
        host = self.meta.get("host")
        return host if isinstance(host, str) and host else socket.gethostname()

    @property
    def job_dir(self) -> pathlib.Path | None:
        """The folder every rank of the job writes in (None: a single-process run)."""
        return self.run_dir.parent if self.rank is not None and self.run_dir else None

    @property
    def label(self) -> str:
        """The run's name for another tool: the folder name, ``<job>/rank<r>`` in a job."""
        return self.name if self.rank is None else f"{self.name.split('/')[0]}/rank{self.rank}"


@runtime_checkable
class Exporter(Protocol):
    """Opens the sink of one run. ``open`` may raise (a missing package, a port in use, a
    login refused): the caller reports it in one line and the run goes on without it."""

    name: str

    def open(self, context: ExportContext) -> Sink:
        """Start exporting ``context``'s run: called once, on the thread that starts it."""


class ExportError(RuntimeError):
    """An exporter that cannot start; the message says why and what to do, in one line."""


def missing(target: str, package: str, extra: str) -> ExportError:
    """The one-line error for an exporter whose package is not installed."""
    return ExportError(
        f"nbmonitor: export to {target} needs the {package} package: "
        f'pip install "nbmonitor[{extra}]"'
    )


def number(value: object) -> float | None:
    """A row's value as a float, or None for what is not a number (text, flags, nested)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass(frozen=True, slots=True)
class Point:
    """One row of a numeric stream, ready to export: its step, its time (None for a stream
    without one) and its values by key (the row's numbers other than step and time)."""

    stream: str
    step: int
    time: float | None
    values: dict[str, float]


def points(streams: Mapping[str, Sequence[Mapping[str, object]]]) -> Iterator[Point]:
    """The rows of the numeric streams (steps, system, layers) as points; rows without a
    finite step are left out (nothing can place them), as are values that are not numbers.
    NaN and Inf are kept: a loss that diverged is data."""
    for stream in PREFIX:
        for row in streams.get(stream, ()):
            step = number(row.get("step"))
            if step is None or not math.isfinite(step):
                continue
            when = number(row.get("time"))
            values = {}
            for key, value in row.items():
                if key not in PLACE:
                    v = number(value)
                    if v is not None:
                        values[key] = v
            if values:
                yield Point(stream, int(step), when, values)


# What of meta.json a tool gets as the run's configuration (W&B's config, MLflow's params).
CONFIG_KEYS = ("model", "optimizer", "backend", "attach", "host")


def config(meta: Mapping[str, object]) -> dict[str, object]:
    """The run's configuration for another tool: the model, the optimizer and its
    hyper-parameters, the backend, attach's options and the host, as meta.json holds them."""
    return {k: meta[k] for k in CONFIG_KEYS if k in meta}


def tag(stream: str, key: str) -> str:
    """``key`` of ``stream`` in a tool with one namespace (``train/loss``)."""
    return f"{PREFIX[stream]}/{key}"


__all__ = [
    "CONFIG_KEYS",
    "PLACE",
    "PREFIX",
    "STEP_KEY",
    "ExportContext",
    "ExportError",
    "Exporter",
    "Point",
    "config",
    "missing",
    "number",
    "points",
    "tag",
]
