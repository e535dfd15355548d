"""Steering a Hugging Face Trainer through its own flags (a real Trainer, a tiny GPT-2 built from
a config, no downloads): a stop ends ``train()`` normally through
``control.should_training_stop`` (nothing raised, the run ``stopped``); a checkpoint is the
Trainer's own ``checkpoint-<N>`` (``control.should_save``), which a new Trainer resumes from;
a learning rate set mid-run is what the next steps use and what the Trainer logs, its scheduler
going on from the new level; a pause holds the Trainer at a step's end while the monitor stays
live."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.helpers import wait_for  # noqa: E402
from tests.hf_setup import quiet_args, tiny_gpt2  # noqa: E402
from tests.test_integrations_hf import Tokens  # noqa: E402

import nbmonitor  # noqa: E402
from nbmonitor.integrations.hf import NbmonitorCallback  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class Asker(transformers.TrainerCallback):  # type: ignore[misc]
    """Asks the monitor at the end of the given steps (after nbmonitor's callback has acted on
    that step), as a dashboard button would: the request is applied at the next step's end."""

    def __init__(self, nb: NbmonitorCallback, asks: dict[int, Callable[[Any], None]]) -> None:
        self.nb = nb
        self.asks = asks

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ask = self.asks.get(state.global_step)
        if ask is not None:
            ask(self.nb.monitor)


def make_trainer(
    tmp_path: Path, runs: Path, max_steps: int, asks: dict[int, Callable[[Any], None]]
) -> tuple[Any, NbmonitorCallback]:
    torch.manual_seed(0)
    args = quiet_args(
        tmp_path,
        max_steps=max_steps,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        logging_steps=1,
    )
    nb = NbmonitorCallback(run_dir=runs, display=False, interval=0.05)
    callbacks = [nb, Asker(nb, asks)]
    trainer = transformers.Trainer(
        tiny_gpt2(), args, train_dataset=Tokens(400, 1), callbacks=callbacks
    )
    return trainer, nb


def steer_events(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("rule") == "steer"]


def test_stop_checkpoint_and_lr_through_the_trainers_flags(tmp_path: Path) -> None:
    max_steps = 100
    asks = {
        2: lambda mon: mon.set_lr(4e-3),
        3: lambda mon: mon.checkpoint(),
        5: lambda mon: mon.stop(),
    }
    trainer, nb = make_trainer(tmp_path, tmp_path / "runs", max_steps, asks)
    out = trainer.train()  # returns: the Trainer stopped itself, nothing was raised
    mon = nb.monitor
    assert mon is not None and out.global_step == trainer.state.global_step == 6
    assert not mon.errors
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert meta["status"] == "stopped" and meta["last_step"] == 6
    run = nbmonitor.open(mon.run_dir)
    h = run.history()
    assert h["step"].tolist() == [1, 2, 3, 4, 5, 6]

    # The learning rate: set at the end of step 3 (asked at step 2's end), after the Trainer's
    # scheduler had stepped; step 4 used it and the linear schedule went on from there.
    logged = {e["step"]: e["learning_rate"] for e in trainer.state.log_history if "loss" in e}

    def linear(k: int) -> float:
        return (max_steps - k) / max_steps

    expected = [1e-3 * linear(k) for k in range(3)]
    expected += [4e-3 * linear(k) / linear(3) for k in range(3, 6)]
    np.testing.assert_allclose(h["lr"], expected, rtol=1e-6)
    np.testing.assert_allclose([logged[s] for s in range(1, 7)], expected, rtol=1e-6)

    # The checkpoint: the Trainer's own, of step 4, with its optimizer and scheduler.
    folder = tmp_path / "out" / "checkpoint-4"
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert (folder / "optimizer.pt").is_file() and (folder / "scheduler.pt").is_file()
    events = [
        (e["step"], e["evidence"]["action"], e["evidence"]["value"])
        for e in steer_events(mon.run_dir)
    ]
    assert events == [(3, "lr", 4e-3), (4, "checkpoint", str(folder)), (6, "stop", None)]

    # A new Trainer resumes from it: its run holds the steps after 4.
    resumed, nb2 = make_trainer(tmp_path, tmp_path / "resumed", 7, {})
    resumed.train(resume_from_checkpoint=str(folder))
    assert nb2.monitor is not None and resumed.state.global_step == 7
    assert nbmonitor.open(nb2.monitor.run_dir).history()["step"].tolist() == [5, 6, 7]
    assert nbmonitor.open(nb2.monitor.run_dir).status == "closed"


def test_a_pause_holds_the_trainer_at_a_steps_end_until_stopped(tmp_path: Path) -> None:
    trainer, nb = make_trainer(tmp_path, tmp_path / "runs", 100, {2: lambda mon: mon.pause()})
    seen: dict[str, Any] = {}

    def watch() -> None:
        # From another thread, as the dashboard: the Trainer pauses at the end of step 3.
        assert wait_for(lambda: nb.monitor is not None and nb.monitor.steering.paused)
        mon = nb.monitor
        seen["paused_at"] = trainer.state.global_step
        # The monitor stays live: the sampler writes the steps so far; the Trainer is held.
        assert mon.flush()
        seen["steps"] = mon.history()["step"].tolist()
        seen["still"] = trainer.state.global_step
        mon.stop()

    watcher = threading.Thread(target=watch)
    watcher.start()
    trainer.train()
    watcher.join(60)
    assert seen == {"paused_at": 3, "steps": [1, 2, 3], "still": 3}
    mon = nb.monitor
    assert mon is not None and trainer.state.global_step == 3
    assert nbmonitor.open(mon.run_dir).status == "stopped"
    actions = [(e["step"], e["evidence"]["action"]) for e in steer_events(mon.run_dir)]
    assert actions == [(3, "pause"), (3, "stop")]


def test_a_plain_attach_before_train_is_stopped_as_a_plain_loop(tmp_path: Path) -> None:
    # No callback: attach(model) before train(). The stop is raised out of the Trainer's
    # optimizer.step() after the update and train() ends with it, the Trainer's global_step
    # one short (it counts after the step returns); the run is closed "stopped" first.
    torch.manual_seed(0)
    args = quiet_args(tmp_path, max_steps=100, per_device_train_batch_size=2, logging_steps=1)
    model = tiny_gpt2()
    mon = nbmonitor.attach(model, run_dir=tmp_path / "runs", display=False)

    class StopAt3(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 3:
                mon.stop()

    trainer = transformers.Trainer(model, args, train_dataset=Tokens(400, 1), callbacks=[StopAt3()])
    with pytest.raises(nbmonitor.StopTraining) as stopped:
        trainer.train()
    assert stopped.value.step == 4 and trainer.state.global_step == 3
    run = nbmonitor.open(mon.run_dir)
    assert run.status == "stopped" and run.history()["step"].tolist() == [1, 2, 3, 4]
