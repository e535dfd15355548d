"""Batch, NullSink and FanOut: a failing sink never costs the others."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import pytest

from nbmonitor.sinks import Batch, FanOut, NullSink, RunLogSink, Sink


class Recording:
    def __init__(self, name: str, fail: str = "") -> None:
        self.name, self.fail = name, fail
        self.calls: list[str] = []

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if what == self.fail:
            raise OSError(f"{self.name} {what} failed")

    def write(self, batch: Batch) -> None:
        self._call("write")

    def flush(self) -> None:
        self._call("flush")

    def close(self, final_meta: Mapping[str, object]) -> None:
        self._call("close")


@pytest.mark.parametrize("fail", ["write", "flush", "close"])
def test_fanout_isolates_a_failing_sink(fail: str) -> None:
    errors: list[tuple[str, str]] = []
    bad, good = Recording("bad", fail), Recording("good")
    fan = FanOut([bad, good], lambda name, exc: errors.append((name, str(exc))))
    fan.write(Batch({"steps": [{"step": 0.0}]}))
    fan.flush()
    fan.close({"status": "closed"})
    assert good.calls == bad.calls == ["write", "flush", "close"]
    assert errors == [("bad", f"bad {fail} failed")]


def test_empty_batch_is_not_written() -> None:
    sink = Recording("s")
    FanOut([sink], lambda n, e: None).write(Batch({"steps": []}))
    assert sink.calls == [] and not Batch() and Batch({"events": [{"time": 1.0}]})


def test_every_sink_meets_the_protocol(tmp_path: pathlib.Path) -> None:
    log = RunLogSink.create(tmp_path, "p", {})
    sinks: list[object] = [NullSink(), FanOut([], lambda n, e: None), log, Recording("r")]
    for sink in sinks:
        assert isinstance(sink, Sink), sink
        assert isinstance(sink.name, str) and sink.name
    NullSink().write(Batch({"steps": [{"step": 1.0}]}))
    log.close({})
