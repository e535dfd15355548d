"""An exporter behind its own bounded queue (``sinks/queued.py``): its tool hanging costs only
itself; the rows waiting for it are bounded, dropped oldest first and counted; close is
bounded and still closes the sink once the tool answers."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from nbmonitor.errors import ErrorLog
from nbmonitor.sinks import Batch, FanOut
from nbmonitor.sinks.queued import Queued


class Blocking:
    """A sink whose writes wait for ``go`` (a tool that stopped answering)."""

    name = "tool"

    def __init__(self) -> None:
        self.go = threading.Event()
        self.entered = threading.Event()
        self.steps: list[float] = []
        self.closed_with: Mapping[str, object] | None = None

    def write(self, batch: Batch) -> None:
        self.entered.set()
        self.go.wait(60)
        self.steps.extend(float(r["step"]) for r in batch.streams["steps"])  # type: ignore[arg-type]

    def flush(self) -> None:
        pass

    def close(self, final_meta: Mapping[str, object]) -> None:
        self.closed_with = final_meta


def rows(first: int, n: int = 5) -> Batch:
    return Batch({"steps": [{"step": float(s)} for s in range(first, first + n)]})


def test_rows_waiting_for_a_hung_tool_are_bounded_and_counted() -> None:
    errors = ErrorLog()
    sink = Blocking()
    queued = Queued(sink, errors, what="Tool export", max_rows=10, hung_after=0.0, close_wait=0.1)
    fan = FanOut([queued], errors)
    fan.write(rows(1))
    assert sink.entered.wait(30)  # the worker is in the tool's call, which does not return
    for first in (6, 11, 16, 21):  # each returns at once: only the worker waits
        fan.write(rows(first))
    assert queued.dropped == 10  # the two oldest waiting ticks, past the 10 rows kept
    assert fan.hung() and set(fan.hung()) == {"Tool export"}
    assert not fan.settle(0.05)  # a flush does not wait on a tool that hangs
    fan.close({"status": "closed"})  # returns at once: the tool's call hangs
    lines = [str(e) for e in errors.entries()]
    assert sum("rows dropped: Tool export is behind" in line for line in lines) == 1, lines
    assert any("Tool export: 10 rows dropped in all" in line for line in lines), lines
    assert any("Tool export has not returned" in line for line in lines), lines
    assert any("did not close: it hangs" in line for line in lines), lines
    fan.close({"status": "closed"})  # idempotent: nothing said twice
    assert len(errors.entries()) == len(lines)
    sink.go.set()  # the tool answers: the rows still waiting are written, then it is closed
    thread = next(t for t in threading.enumerate() if t.name == "nbmonitor-export-tool")
    thread.join(30)
    assert sink.steps == [float(s) for s in [*range(1, 6), *range(16, 26)]]
    assert sink.closed_with == {"status": "closed"}


def test_settle_waits_for_what_was_queued() -> None:
    errors = ErrorLog()
    sink = Blocking()
    sink.go.set()
    fan = FanOut([Queued(sink, errors)], errors)
    for first in range(1, 100, 5):
        fan.write(rows(first))
        fan.flush()
    assert fan.settle(30)
    assert sink.steps == [float(s) for s in range(1, 101)]
    fan.close({})
    assert sink.closed_with == {} and errors.entries() == []
