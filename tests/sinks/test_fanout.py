"""Batch, NullSink and FanOut: a failing sink never costs the others."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import pytest

from nbmonitor.errors import ErrorLog
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
    errors = ErrorLog()
    bad, good = Recording("bad", fail), Recording("good")
    fan = FanOut([bad, good], errors)
    fan.write(Batch({"steps": [{"step": 0.0}]}))
    fan.flush()
    fan.close({"status": "closed"})
    assert good.calls == bad.calls == ["write", "flush", "close"]
    assert [(e.source, e.message.split(" (")[0]) for e in errors.entries()] == [
        ("sink:bad", f"OSError: bad {fail} failed")
    ]


def test_a_sink_failing_again_and_again_is_switched_off_and_tried_again_later() -> None:
    errors, now = ErrorLog(), [0.0]
    bad, good = Recording("bad", "write"), Recording("good")
    fan = FanOut([bad, good], errors, retry_after=30.0, clock=lambda: now[0])
    batch = Batch({"steps": [{"step": 0.0}]})
    for _ in range(8):
        fan.write(batch)
    assert bad.calls == ["write"] * 5  # off after 5 failures in a row
    assert good.calls == ["write"] * 8
    assert errors.counts == {"sink:bad": 5} and "sink:bad" in errors.disabled
    now[0] = 31.0
    fan.write(batch)  # tried again once the retry time has passed
    assert bad.calls == ["write"] * 6
    fan.close({"status": "closed"})
    assert bad.calls[-1] == "close"  # closed although switched off: its files need it


def test_empty_batch_is_not_written() -> None:
    sink = Recording("s")
    FanOut([sink], ErrorLog()).write(Batch({"steps": []}))
    assert sink.calls == [] and not Batch() and Batch({"events": [{"time": 1.0}]})


def test_every_sink_meets_the_protocol(tmp_path: pathlib.Path) -> None:
    log = RunLogSink.create(tmp_path, "p", {})
    sinks: list[object] = [NullSink(), FanOut([], ErrorLog()), log, Recording("r")]
    for sink in sinks:
        assert isinstance(sink, Sink), sink
        assert isinstance(sink.name, str) and sink.name
    NullSink().write(Batch({"steps": [{"step": 1.0}]}))
    log.close({})
