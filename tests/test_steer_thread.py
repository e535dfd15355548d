"""Steering a training loop that runs in a background thread (as a notebook runs one to keep its
kernel free): a pause holds that thread at a step's end while the main thread and the sampler
stay live; a checkpoint and a learning rate asked while it is held apply at that step; a stop
ends the loop at a step boundary by raising in that thread (the loop's own code sees a
``StopTraining``), and the run closes ``stopped`` with its steps contiguous."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import mlp, wait_for

import nbmonitor

pytestmark = pytest.mark.timeout(120)


def test_a_loop_in_a_thread_is_paused_checkpointed_and_stopped(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
    got: dict[str, Any] = {"steps": 0}

    def loop() -> None:
        try:
            for _ in range(1_000_000):
                loss = model(torch.randn(4, 8)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                got["steps"] += 1
        except nbmonitor.StopTraining as exc:  # the thread's own code sees the stop
            got["stopped"] = exc
            got["in"] = threading.current_thread().name
            raise  # uncaught, it ends the thread without a traceback

    worker = threading.Thread(target=loop, name="trainer")
    worker.start()
    try:
        assert wait_for(lambda: mon.step >= 5)
        mon.pause()
        assert wait_for(lambda: mon.steering.paused)
        held = mon.step
        # The main thread and the sampler stay live while the loop is held at held's end.
        assert mon.flush()
        assert mon.history()["step"].tolist() == list(range(1, held + 1))
        mon.set_lr(0.5)
        mon.checkpoint()
        ckpt = mon.run_dir / "checkpoints" / f"step-{held}.pt"
        assert wait_for(ckpt.is_file)
        assert opt.param_groups[0]["lr"] == 0.5  # applied while held, at held's boundary
        # Held inside optimizer.step() at held's end: the update done, the loop not on yet.
        assert mon.flush() and mon.step == held == got["steps"] + 1 and worker.is_alive()
        mon.resume()
        assert wait_for(lambda: mon.step > held + 3)
        mon.stop()
        worker.join(60)
        assert not worker.is_alive()
    finally:
        mon.close()
    stop = got["stopped"]
    # Raised out of optimizer.step() after the update: the loop's count stops one short.
    assert got["in"] == "trainer" and stop.step == got["steps"] + 1 == mon.step
    # The checkpoint loads, and holds the step it was taken at.
    state = torch.load(ckpt, weights_only=False)
    assert state["step"] == held and set(state) >= {"model", "optimizer", "step"}
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert meta["status"] == "stopped" and meta["last_step"] == stop.step
    steps = nbmonitor.open(mon.run_dir).history()["step"].tolist()
    assert steps == list(range(1, stop.step + 1))
    events = [
        (e["step"], e["evidence"]["action"])
        for e in map(json.loads, (mon.run_dir / "events.jsonl").read_text().splitlines())
        if e.get("rule") == "steer"
    ]
    assert events == [
        (held, "pause"),
        (held, "lr"),
        (held, "checkpoint"),
        (held, "resume"),
        (stop.step, "stop"),
    ]
