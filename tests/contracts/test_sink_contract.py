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
