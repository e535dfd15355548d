"""What a session hands its pipeline (``PipelineParts``): what every session has, and what only
a training run has (``Training``, one optional part: a watch of the machine has none). And the
name of the device the run trains on, as the MFU peak table matches it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from nbmonitor._engine.assemble.layers import LayerStats
from nbmonitor._engine.frame import RunInfo
from nbmonitor._engine.run_model import RunModel
from nbmonitor.backends.base import Backend
from nbmonitor.errors import ErrorLog
from nbmonitor.health import Health
from nbmonitor.health.alert import Alert
from nbmonitor.health.view import RankColumns
from nbmonitor.records import Record
from nbmonitor.sinks import FanOut


class Steer(Protocol):
    """A live run's steering as the sampler sees it (``live/steering.py``)."""

    def poll(self) -> None:
        """Read the run's control directory (file I/O: run on a source's worker)."""

    def take(self) -> list[Alert]:
        """The steering requests applied or refused since the last call, as alerts."""


@dataclass(frozen=True)
class Training:
    """What only a training run gives its pipeline: the training thread's records and what
    reads them."""

    drain: Callable[[bool], list[Record]]  # the recorder's; True waits for device values
    layers: LayerStats
    forward_checked: bool
    update_copy_skipped: Callable[[], float | None] = lambda: None
    # Every rank's step columns (the display rank of a distributed job), for the straggler
    # rule: it reads files, so it runs on the run log's worker (a hung filesystem holds it).
    ranks: Callable[[], RankColumns | None] | None = None
    # In a distributed job, the step phase the training thread is in now (an index into
    # records.PHASES, None when unknown): written with each system sample (``phase``), so that
    # whoever reads the job sees where a rank that stopped making progress is.
    current_phase: Callable[[], int | None] | None = None
    # A live run's steering: its events taken and its control directory polled each tick.
    steer: Steer | None = None


@dataclass(frozen=True)
class PipelineParts:
    """What an entrance hands its session's pipeline."""

    info: RunInfo
    backend: Backend
    # The run's step; a watch of the machine counts its samples instead.
    current_step: Callable[[], int]
    health: Health
    sinks: FanOut  # every tick's rows go here, each sink behind its own guard
    errors: ErrorLog
    # None: no training loop (a watch of the machine), so no records, layers or ranks.
    training: Training | None = None
    clock: Callable[[], float] = time.time
    interval: float = 0.5
    # The run model the pipeline fills; None: a new one for the layers and the backend's device.
    model: RunModel | None = None


def device_name(backend: Backend) -> str:
    """The name of the device the model trains on, as the MFU peak table matches it."""
    index, devices = backend.device_index, backend.devices
    if index is not None and 0 <= index < len(devices):
        return devices[index]
    if backend.name == "mps" and devices:
        return devices[0]
    return backend.name.upper()


__all__ = ["PipelineParts", "Steer", "Training", "device_name"]
