"""Every sink meets the Sink protocol: it takes a tick's batch, flushes, and closes twice
without raising (close is the last thing a closing monitor does)."""

from __future__ import annotations

import math
import pathlib

import nbmonitor
from nbmonitor.errors import ErrorLog
from nbmonitor.sinks import Batch, FanOut, NullSink, RunLogSink, Sink

BATCH = Batch(
    {
        "steps": [{"step": 1.0, "time": 1.0, "loss": 0.5}, {"step": 2.0, "loss": math.nan}],
        "system": [{"time": 1.0, "step": 1.0, "cpu_percent": 12.0}],
        "events": [{"rule": "r", "severity": "info", "message": "m", "step": 1, "time": 1.0}],
        "layers": [{"step": 2.0, "grad_norm/w": 0.1}],
    }
)


def sinks(tmp_path: pathlib.Path) -> list[Sink]:
    return [
        NullSink(),
        RunLogSink.create(tmp_path, "contract", {}),
        FanOut([RunLogSink.create(tmp_path, "fanned", {})], ErrorLog()),
    ]


def test_every_sink_takes_a_batch_flushes_and_closes_twice(tmp_path: pathlib.Path) -> None:
    for sink in sinks(tmp_path):
        assert isinstance(sink, Sink), sink
        assert isinstance(sink.name, str) and sink.name
        sink.write(BATCH)
        sink.flush()
        sink.close({"status": "closed", "steps": 2})
        sink.close({"status": "closed", "steps": 2})  # idempotent, never raises
    for path in tmp_path.iterdir():  # what the run-log sinks wrote reads back whole
        run = nbmonitor.open(path)
        assert run.history()["step"].tolist() == [1.0, 2.0]
        assert [e["rule"] for e in run.events()] == ["r"]
        assert run.status == "closed"


def test_every_exporter_sink_takes_a_batch_flushes_and_closes_twice(
    tmp_path: pathlib.Path,
) -> None:
    """The exporters whose tools are installed (the others: tests/export round trips)."""
    import importlib.util

    from nbmonitor.sinks.exporter import ExportContext

    run = RunLogSink.create(tmp_path / "runs", "exported", {})
    run.write(BATCH)
    run.close({"status": "closed"})
    context = ExportContext(run.path.name, run.path, run.meta)
    exporters: list[object] = [nbmonitor.export.CSV(out=tmp_path / "csv")]
    if importlib.util.find_spec("tensorboard") is not None:
        exporters.append(nbmonitor.export.TensorBoard(log_dir=tmp_path / "tb"))
    if importlib.util.find_spec("pyarrow") is not None:
        exporters.append(nbmonitor.export.Parquet(out=tmp_path / "pq"))
    if importlib.util.find_spec("prometheus_client") is not None:
        exporters.append(nbmonitor.export.Prometheus(port=0))
    for exporter in exporters:
        assert isinstance(exporter, nbmonitor.export.Exporter)
        sink = exporter.open(context)
        assert isinstance(sink, Sink), sink
        assert sink.name == exporter.name
        sink.write(BATCH)
        sink.flush()
        sink.close({"status": "closed", "steps": 2})
        sink.close({"status": "closed", "steps": 2})
