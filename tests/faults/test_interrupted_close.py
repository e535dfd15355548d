"""Ctrl-C while close() waits, then close() again: the run is still finalised, every record on
disk and meta.json closed."""

from __future__ import annotations

import json
import signal
import sys
import threading
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
    """A view whose close() sends a real SIGINT to the main thread, which is inside
    ``mon.close()`` waiting for it right then, and returns only once the test has seen the
    KeyboardInterrupt: the interrupt lands at a known point, whatever the machine's load
    (a timer racing the close could miss it on a busy machine)."""

    wants_detail = False

    def __init__(self) -> None:
        self.released = threading.Event()
        self.interrupts = 0
        self.closed = 0

    def publish(self, frame: Frame) -> None:
        pass

    def close(self, frame: Frame) -> None:
        if self.interrupts == 0:
            self.interrupts += 1
            # A real signal (not _thread.interrupt_main, a flag the main thread reads only
            # once its wait ends): it interrupts the wait in close(), as Ctrl-C does.
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            assert self.released.wait(RELEASE_S), "the KeyboardInterrupt never reached the test"
        self.closed += 1


# How long the interrupted view waits for the test to see the KeyboardInterrupt: a bound on a
# wait for an event, never a pause.
RELEASE_S = 120.0


def test_a_real_ctrl_c_while_close_waits_then_close_again_finalises(tmp_path, monkeypatch):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60)
    view = _InterruptingView()
    mon.add_view(view)
    train(model, opt, mon, 4)
    # Ctrl-C arrives in the main thread while close() waits for the view to close; close()
    # waits long enough that it is still waiting then, however slow the machine.
    monkeypatch.setattr(sys.modules[type(mon).__module__], "CLOSE_WAIT_S", RELEASE_S)
    try:
        with pytest.raises(KeyboardInterrupt):
            mon.close()
    finally:
        view.released.set()
    mon.close()
    meta = _meta(mon)
    assert meta["status"] == "closed", meta.get("errors")
    assert meta["steps"] == 4
    assert nbmonitor.open(mon.run_dir).history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert view.interrupts == 1 and view.closed >= 1
