"""The session core (``_engine/session.py``) on its own, no torch: start, status and errors,
flush, views, and a close that is bounded, idempotent and never raises, whatever hangs."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from tests.helpers import WAIT_S, wait_for

from nbmonitor._engine.assemble.layers import LayerStats
from nbmonitor._engine.frame import Frame, RunInfo
from nbmonitor._engine.pipeline_parts import PipelineParts, Training
from nbmonitor._engine.session import Session
from nbmonitor.errors import ErrorLog
from nbmonitor.health import Alert, Health
from nbmonitor.health.rules.devices import DEVICE_RULES
from nbmonitor.records import Record
from nbmonitor.sinks import Batch, FanOut

# A hung source hangs this long unless the test releases it (it always does, at teardown).
HANG_S = 300.0


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # the hung calls return and their threads end before the leak check


class FakeBackend:
    name = "fake"
    devices: tuple[str, ...] = ()
    device_index: int | None = None

    def __init__(self, hang: threading.Event | None = None) -> None:
        self.notes: list[str] = []
        self.hang = hang
        self.hanging = threading.Event()  # set while a sample() waits for ``hang``
        self.samples = 0
        self.closes = 0

    @property
    def keys(self) -> tuple[str, ...]:
        return ("x",)

    def sample(self) -> dict[str, float]:
        if self.hang is not None:
            self.hanging.set()
            self.hang.wait(HANG_S)
        self.samples += 1
        return {"x": float(self.samples)}

    def device_gauges(self, sample: dict[str, float]) -> list[dict[str, float | str]]:
        return []

    def close(self) -> None:
        self.closes += 1


class ListSink:
    name = "list"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.batches: list[Batch] = []
        self.finals: list[dict[str, object]] = []

    def write(self, batch: Batch) -> None:
        if self.fail:
            raise OSError("disk full")
        self.batches.append(batch)

    def flush(self) -> None:
        pass

    def close(self, final_meta: Mapping[str, object]) -> None:
        self.finals.append(dict(final_meta))

    def rows(self, stream: str) -> list[Mapping[str, object]]:
        return [row for b in self.batches for row in b.streams.get(stream, ())]


class ListView:
    wants_detail = False

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.closed: list[Frame] = []

    def publish(self, frame: Frame) -> None:
        self.frames.append(frame)

    def close(self, frame: Frame) -> None:
        self.closed.append(frame)


def session(
    backend: FakeBackend,
    sinks: list[Any],
    *,
    training: Training | None = None,
    interval: float = 60.0,  # no scheduled tick: flush() and close() drive it
    stop: Any = None,
) -> Session:
    errors = ErrorLog()
    parts = PipelineParts(
        info=RunInfo("test", backend.name, None, 0),
        backend=backend,
        current_step=lambda: 0,
        health=Health(None, rules=DEVICE_RULES),
        sinks=FanOut(sinks, errors),
        errors=errors,
        training=training,
        interval=interval,
    )
    counts = lambda: {"steps": 0}  # noqa: E731
    return Session(parts, counts=counts, stop=stop) if stop else Session(parts, counts=counts)


def test_status_and_errors_from_start_to_close() -> None:
    backend, good, bad = FakeBackend(), ListSink(), ListSink(fail=True)
    s = session(backend, [good])
    assert s.status() == "running" and s.errors == []
    s.start()
    assert s.flush(WAIT_S)
    assert [row["x"] for row in good.rows("system")] == [1.0]
    s.close()
    assert s.status() == "closed"
    assert good.finals == [good.finals[0]] and good.finals[0]["status"] == "closed"
    assert good.finals[0]["steps"] == 0 and good.finals[0]["errors"] == []
    assert backend.closes == 1

    degraded = session(FakeBackend(), [bad])
    assert degraded.flush(WAIT_S)  # not started: the flush ticks here
    assert degraded.status() == "degraded"
    assert any("sink:list" in e and "disk full" in e for e in degraded.errors)
    degraded.close()
    assert degraded.status() == "closed"
    assert bad.finals[0]["status"] == "degraded"
    assert any("disk full" in str(e) for e in bad.finals[0]["errors"])  # type: ignore[attr-defined]


def test_close_twice_runs_every_part_once() -> None:
    backend, sink, view = FakeBackend(), ListSink(), ListView()
    stops: list[str] = []
    s = session(backend, [sink], stop=lambda: stops.append("stop"))
    s.on_close.append(lambda: stops.append("first"))
    s.add_view(view)
    s.start()
    s.close()
    s.close()
    assert stops == ["first", "stop"]
    assert len(sink.finals) == 1 and backend.closes == 1
    assert len(view.closed) == 1 and view.closed[0].status == "closed"
    assert s.flush(WAIT_S)  # nothing left to take once closed
    late = ListView()
    s.add_view(late)  # a view added after close is closed at once, with the last frame
    assert len(late.closed) == 1 and late.frames == []


def test_a_failing_first_step_is_reported_and_the_close_goes_on() -> None:
    backend, sink = FakeBackend(), ListSink()

    def stop() -> None:
        raise RuntimeError("hook already gone")

    view = ListView()
    s = session(backend, [sink], stop=stop)
    s.on_close.append(lambda: 1 / 0)  # type: ignore[func-returns-value]
    s.add_view(view)
    s.start()
    s.close()
    assert not s.thread.alive
    assert any("ZeroDivisionError" in e for e in s.errors)
    assert any("hook already gone" in e for e in s.errors)
    # The last tick still ran (the views got the last frame) and the final meta says what
    # failed.
    assert len(view.closed) == 1
    assert sink.finals[0]["status"] == "degraded"
    assert any("hook already gone" in str(e) for e in sink.finals[0]["errors"])  # type: ignore[attr-defined]
    assert backend.closes == 1


def test_close_does_not_wait_for_a_hung_backend(release: threading.Event) -> None:
    backend, sink = FakeBackend(hang=release), ListSink()
    s = session(backend, [sink], interval=0.05)
    s.start()
    assert wait_for(lambda: s.status().startswith("degraded: system sampling hung for"))
    s.close(wait=0.5)
    # Returned with the backend's call still hanging: its close is left for when it returns.
    assert not release.is_set() and backend.closes == 0
    assert s.status() == "closed"
    assert len(sink.finals) == 1 and sink.finals[0]["status"] == "degraded"
    release.set()
    assert wait_for(lambda: backend.closes == 1)


def test_close_gives_up_on_a_tick_stuck_in_a_source(release: threading.Event) -> None:
    stuck = threading.Event()

    def drain(wait: bool) -> list[Record]:
        stuck.set()
        release.wait(HANG_S)  # the training side never answers: the tick holds the pipeline
        return []

    training = Training(drain=drain, layers=LayerStats([]), forward_checked=False)
    backend, sink = FakeBackend(), ListSink()
    s = session(backend, [sink], training=training, interval=0.05)
    s.start()
    assert stuck.wait(WAIT_S)
    with pytest.raises(TimeoutError, match="stuck in a source"):
        s.frame(timeout=0.1)
    s.close(wait=0.5)
    assert not release.is_set()  # returned while the tick still hangs
    assert s.status() == "closed"
    assert any("the last interval was not written" in e for e in s.errors)
    # The files are closed all the same, saying what failed.
    assert len(sink.finals) == 1 and sink.finals[0]["status"] == "degraded"
    assert wait_for(lambda: backend.closes == 1)  # on its worker, past close()'s deadline
    s.close(wait=0.5)  # and again: nothing more, no raise
    assert len(sink.finals) == 1 and backend.closes == 1


def test_a_view_that_closes_the_session_from_its_worker() -> None:
    sink = ListSink()
    done = threading.Event()

    class Closing(ListView):
        def publish(self, frame: Frame) -> None:
            super().publish(frame)
            s.close()  # on the view's worker: handed to a thread of its own
            done.set()

    s = session(FakeBackend(), [sink], interval=0.05)
    s.add_view(Closing())
    s.start()
    assert done.wait(WAIT_S)
    assert s.status() == "closed"
    assert wait_for(lambda: len(sink.finals) == 1)
    assert sink.finals[0]["status"] in ("closed", "degraded")


def test_a_sample_waits_for_the_steering_poll_still_on_its_worker() -> None:
    # The steering poll reads the control directory on the sample's worker after each sample:
    # a flush right after a tick finds it there, and the sample waits for it instead of
    # taking the worker for hung (a NaN sample and an error).
    polling, go = threading.Event(), threading.Event()

    class SlowSteer:
        def poll(self) -> None:
            polling.set()
            go.wait(WAIT_S)

        def take(self) -> list[Alert]:
            return []

    training = Training(
        drain=lambda wait: [], layers=LayerStats([]), forward_checked=False, steer=SlowSteer()
    )
    backend, sink = FakeBackend(), ListSink()
    s = session(backend, [sink], training=training)
    try:
        assert s.flush(WAIT_S)
        assert polling.wait(WAIT_S)  # the poll holds the worker now
        second = threading.Thread(target=s.flush, args=(WAIT_S,), name="nbmonitor-test-flush")
        second.start()
        second.join(0.2)  # most often the second sample waits for the poll by now
        go.set()
        second.join(WAIT_S)
        assert s.errors == []
        assert [row["x"] for row in sink.rows("system")] == [1.0, 2.0]
    finally:
        go.set()
        s.close()
