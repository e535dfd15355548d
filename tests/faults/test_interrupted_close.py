"""Ctrl-C while close() waits, then close() again: the run is still finalised, every record on
disk and meta.json closed."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any

import pytest
import torch
from tests.helpers import mlp, train

import nbmonitor
from nbmonitor._engine.frame import Frame
from nbmonitor._engine.sampler import SamplerThread


def _meta(mon: Any) -> dict[str, Any]:
    return json.loads((mon.run_dir / "meta.json").read_text())  # type: ignore[no-any-return]


def test_interrupt_while_close_stops_the_sampler_then_close_again_finalises(tmp_path, monkeypatch):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60)
    train(model, opt, mon, 5)
    stop = SamplerThread.stop
    calls = []

    def interrupted(self: SamplerThread, timeout: float = 5.0) -> bool:
        calls.append(timeout)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return stop(self, timeout)

    monkeypatch.setattr(SamplerThread, "stop", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mon.close()
    assert mon.status == "closed"  # no more records are taken from the loop
    assert "status" not in _meta(mon)  # not final yet: the files are still open
    mon.close()
    meta = _meta(mon)
    assert meta["status"] == "closed" and meta["steps"] == 5
    assert nbmonitor.open(mon.run_dir).history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(model._forward_hooks) == 0
    mon.close()  # and a third time does nothing
    assert len(calls) == 2


class _InterruptingView:
    """A view whose close() interrupts the main thread with a real SIGINT while it is inside
    ``mon.close()`` waiting for that very close() to return: the interrupt lands at a known
    point, whatever the machine's load (a timer racing the close could miss it on a busy
    machine)."""

    wants_detail = False

    def __init__(self) -> None:
        self.delivered = threading.Event()  # set by the SIGINT handler as it raises
        self.closed = 0

    def publish(self, frame: Frame) -> None:
        pass

    def close(self, frame: Frame) -> None:
        # Sent until the handler has run: a signal that arrives just before the main thread
        # blocks in its wait is only noted, and interrupts nothing until the next one.
        deadline = time.monotonic() + DELIVERY_S
        main = threading.main_thread().ident or 0
        while not self.delivered.is_set() and time.monotonic() < deadline:
            signal.pthread_kill(main, signal.SIGINT)
            self.delivered.wait(0.01)
        self.closed += 1


# A bound on waiting for the interrupt to be handled, never a pause.
DELIVERY_S = 120.0


def test_a_real_ctrl_c_while_close_waits_then_close_again_finalises(tmp_path, monkeypatch):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60)
    view = _InterruptingView()
    mon.add_view(view)
    train(model, opt, mon, 4)

    def ctrl_c(signum: int, frame: Any) -> None:
        # Python's own handler raises KeyboardInterrupt; this one does so once.
        if not view.delivered.is_set():
            view.delivered.set()
            raise KeyboardInterrupt

    # Ctrl-C arrives in the main thread while close() waits for the view to close; close()
    # waits long enough that it is still waiting then, however slow the machine.
    monkeypatch.setattr(sys.modules[type(mon).__module__], "CLOSE_WAIT_S", DELIVERY_S)
    previous = signal.signal(signal.SIGINT, ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            mon.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    mon.close()
    meta = _meta(mon)
    assert meta["status"] == "closed", meta.get("errors")
    assert meta["steps"] == 4
    assert nbmonitor.open(mon.run_dir).history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert view.delivered.is_set() and view.closed >= 1
