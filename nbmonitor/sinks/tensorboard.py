"""TensorBoard: every numeric stream as scalars, with TensorBoard's own event writer.

The writer is ``tensorboard.summary.writer.event_file_writer.EventFileWriter`` (the one
``torch.utils.tensorboard`` uses, from the ``tensorboard`` package: extra ``tensorboard``),
not a protobuf encoder of our own. Each stream is one TensorBoard run under the log folder
(``train/``, ``system/``, ``layers/``): TensorBoard's reader treats a step that goes back as a
restart and drops what came after it, and the streams' steps interleave (a system sample is
stamped with the step in progress, a layer row with the step it measured), so each stream keeps
its own, never decreasing, steps in its own file. One event per row, one value per key (the
row's ``time`` as its wall time). ``flush()`` comes with the run log's (each sampler tick), not
after TensorBoard's default two minutes.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.exporter import PREFIX, ExportContext, ExportError, missing, points


@dataclass(frozen=True)
class TensorBoard:
    """Export to TensorBoard event files in ``log_dir`` (default: ``<run folder>/tensorboard``;
    in a job, one ``rank<r>/`` folder per rank). View with ``tensorboard --logdir LOG_DIR``."""

    log_dir: str | os.PathLike[str] | None = None
    name: str = "tensorboard"

    def open(self, context: ExportContext) -> TensorBoardSink:
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise missing("TensorBoard", "tensorboard", "tensorboard") from None
        if self.log_dir is not None:
            root = pathlib.Path(self.log_dir)
            if context.rank is not None:
                root = root / f"rank{context.rank}"
        elif context.run_dir is not None:
            root = context.run_dir / "tensorboard"
        else:
            raise ExportError("nbmonitor: export to TensorBoard needs log_dir= (no run folder)")
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".nbmonitor-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise ExportError(
                f"nbmonitor: cannot write TensorBoard files to '{root}' "
                f"({exc.strerror or type(exc).__name__}); pass log_dir= a writable folder"
            ) from None
        return TensorBoardSink(root, EventFileWriter, event_pb2, summary_pb2)


class TensorBoardSink:
    """Writes each numeric stream's rows as scalar events; see the module docstring."""

    name = "tensorboard"

    def __init__(self, root: pathlib.Path, writer: Any, event_pb2: Any, summary_pb2: Any) -> None:
        self.root = root
        self._writer_class = writer
        self._event = event_pb2.Event
        self._summary = summary_pb2.Summary
        self._writers: dict[str, Any] = {}
        self._closed = False

    def _writer(self, stream: str) -> Any:
        writer = self._writers.get(stream)
        if writer is None:
            # flush_secs: ours come every tick; TensorBoard's own timer only as a backstop.
            writer = self._writer_class(str(self.root / PREFIX[stream]), 1024, 120.0)
            self._writers[stream] = writer
        return writer

    def write(self, batch: Batch) -> None:
        if self._closed:
            return
        value, event, summary = self._summary.Value, self._event, self._summary
        for point in points(batch.streams):
            values = [value(tag=k, simple_value=v) for k, v in point.values.items()]
            self._writer(point.stream).add_event(
                event(
                    wall_time=point.time if point.time is not None else time.time(),
                    step=point.step,
                    summary=summary(value=values),
                )
            )

    def flush(self) -> None:
        for writer in self._writers.values():
            writer.flush()

    def close(self, final_meta: Mapping[str, object]) -> None:
        if self._closed:
            return
        self._closed = True
        for writer in self._writers.values():
            with contextlib.suppress(Exception):
                writer.close()


__all__ = ["TensorBoard", "TensorBoardSink"]
