"""trackio: every numeric stream into a local trackio project (SQLite under ``TRACKIO_DIR``,
default ``~/.cache/huggingface/trackio``), viewed with ``trackio show``.

A new trackio run is started in ``open`` (``project`` default ``"nbmonitor"``, named after
nbmonitor's run) with trackio's own CPU/GPU logging off (nbmonitor's system rows are logged
instead), and finished at close. Each row is one ``log`` call with nbmonitor's step. Keys:
``train/<key>``, ``system/<key>``, ``layers/<key>``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.exporter import ExportContext, ExportError, missing, points, tag


@dataclass(frozen=True)
class Trackio:
    """Export to a local trackio project (``settings``: more ``trackio.init`` arguments, such
    as ``space_id`` to log to a Hugging Face Space instead)."""

    project: str = "nbmonitor"
    settings: Mapping[str, Any] = field(default_factory=dict)
    name: str = "trackio"

    def open(self, context: ExportContext) -> TrackioSink:
        try:
            import trackio
        except ImportError:
            raise missing("trackio", "trackio", "trackio") from None
        init: dict[str, Any] = {
            "project": self.project,
            "name": context.label,
            "auto_log_gpu": False,
            "auto_log_cpu": False,
            "embed": False,
        }
        if context.rank is not None:
            init["group"] = context.name.split("/")[0]
        init.update(self.settings)
        try:
            run = trackio.init(**init)
        except Exception as exc:
            text = " ".join(str(exc).split())[:300]
            raise ExportError(f"nbmonitor: trackio did not start a run ({text})") from None
        return TrackioSink(run)


class TrackioSink:
    """Logs each row with its step into one trackio run."""

    name = "trackio"

    def __init__(self, run: Any) -> None:
        self.run = run
        self._closed = False

    def write(self, batch: Batch) -> None:
        if self._closed:
            return
        for point in points(batch.streams):
            self.run.log({tag(point.stream, k): v for k, v in point.values.items()}, point.step)

    def flush(self) -> None:
        pass  # trackio writes its SQLite from its own thread

    def close(self, final_meta: Mapping[str, object]) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.run.finish()


__all__ = ["Trackio", "TrackioSink"]
