"""Weights & Biases: every numeric stream into a W&B run, on nbmonitor's step axis.

W&B's current run (``wandb.run``) is per thread and ``wandb.log`` is meant for one thread, so
the run is captured in ``open``, on the thread that attaches (the user's): the active run if
there is one (nbmonitor logs into it and leaves it open), else one started with the user's
settings (``project``, ``entity``, ``mode``... and W&B's environment, ``WANDB_MODE=offline``
included), finished at close. Every key is logged against ``nbmonitor/step``
(``define_metric``), never W&B's own ``_step``: W&B silently drops a row whose ``step=`` goes
back, and a system sample and a step row share a step. Keys: ``train/<key>``,
``system/<key>``, ``layers/<key>``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.exporter import (
    PREFIX,
    STEP_KEY,
    ExportContext,
    ExportError,
    config,
    missing,
    points,
    tag,
)


@dataclass(frozen=True)
class WandB:
    """Export to Weights & Biases: into the active run, else a new one (``project`` default
    ``"nbmonitor"``, ``name`` the run's; ``settings`` are more ``wandb.init`` arguments)."""

    project: str | None = None
    entity: str | None = None
    mode: str | None = None
    dir: str | os.PathLike[str] | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    name: str = "wandb"

    def open(self, context: ExportContext) -> WandBSink:
        try:
            import wandb
        except ImportError:
            raise missing("W&B", "wandb", "wandb") from None
        run: Any = wandb.run  # the active run of this (the attaching) thread
        started = run is None
        if started:
            init: dict[str, Any] = {
                "project": self.project or os.environ.get("WANDB_PROJECT") or "nbmonitor",
                "name": context.label,
                "config": {"nbmonitor": config(context.meta)},
                "reinit": "create_new",
            }
            if context.rank is not None:
                init["group"] = context.name.split("/")[0]
            for key, value in (("entity", self.entity), ("mode", self.mode), ("dir", self.dir)):
                if value is not None:
                    init[key] = os.fspath(value) if key == "dir" else value
            init.update(self.settings)
            try:
                run = wandb.init(**init)
            except Exception as exc:  # a login or entity refused: one line, not W&B's trace
                text = " ".join(str(exc).split())[:300]
                raise ExportError(f"nbmonitor: W&B did not start a run ({text})") from None
        run.define_metric(STEP_KEY)
        for prefix in PREFIX.values():
            run.define_metric(f"{prefix}/*", step_metric=STEP_KEY)
        return WandBSink(run, started)


class WandBSink:
    """Logs each row as one W&B history row with its ``nbmonitor/step``."""

    name = "wandb"

    def __init__(self, run: Any, started: bool) -> None:
        self.run = run
        self.started = started
        self._closed = False

    def write(self, batch: Batch) -> None:
        if self._closed:
            return
        log = self.run.log
        for point in points(batch.streams):
            row: dict[str, float] = {tag(point.stream, k): v for k, v in point.values.items()}
            row[STEP_KEY] = point.step
            log(row)

    def flush(self) -> None:
        pass  # W&B's own process takes each row as it is logged

    def close(self, final_meta: Mapping[str, object]) -> None:
        if self._closed:
            return
        self._closed = True
        if self.started:
            with contextlib.suppress(Exception):
                self.run.finish(exit_code=0 if final_meta.get("status") != "degraded" else 1)


__all__ = ["WandB", "WandBSink"]
