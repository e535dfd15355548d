"""Steering a Lightning Trainer through its own flag (a real Trainer, a tiny LightningModule on
the CPU): a stop ends ``fit()`` normally through ``trainer.should_stop`` (nothing raised, the
run ``stopped``), at the step asked for also with accumulated batches; a checkpoint is
``trainer.save_checkpoint`` at that step's end, which ``fit(ckpt_path=...)`` resumes from; a
learning rate set mid-run is what the following steps use, the scheduler going on from the new
level; a pause holds the Trainer while the monitor stays live."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.helpers import wait_for

L = pytest.importorskip("lightning")

import nbmonitor  # noqa: E402
from nbmonitor.integrations.lightning import NbmonitorCallback  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings(
        "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning",
        "ignore:.*does not have many workers:UserWarning",
        "ignore:.*is smaller than the logging interval:UserWarning",
        # Resuming mid-epoch from a plain DataLoader: Lightning's notice, not ours.
        "ignore:You're resuming from a checkpoint that ended before the epoch ended",
    ),
]


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Asker(L.Callback):
    """Asks the monitor at the end of the given steps (after nbmonitor's callback acted on that
    step): the request is applied at the end of the next step."""

    def __init__(self, nb: NbmonitorCallback, asks: dict[int, Callable[[Any], None]]) -> None:
        self.nb = nb
        self.asks = asks
        self.lrs: dict[int, float] = {}  # the lr each step used, as the optimizer held it

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.lrs[trainer.global_step + 1] = optimizer.param_groups[0]["lr"]

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        ask = self.asks.pop(trainer.global_step, None)
        if ask is not None:
            ask(self.nb.monitor)


def fit(
    tmp_path: Path,
    asks: dict[int, Callable[[Any], None]],
    *,
    accumulate: int = 1,
    max_steps: int = 200,
    ckpt_path: str | None = None,
    runs: str = "runs",
) -> tuple[Any, NbmonitorCallback, Asker]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=gen)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    nb = NbmonitorCallback(run_dir=tmp_path / runs, display=False, interval=0.05)
    asker = Asker(nb, asks)
    trainer = L.Trainer(
        max_steps=max_steps,
        accumulate_grad_batches=accumulate,
        accelerator="cpu",
        callbacks=[nb, asker],
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer.fit(Regressor(), loader, ckpt_path=ckpt_path)
    return trainer, nb, asker


def steer_events(run_dir: Path) -> list[tuple[int, str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    events = [e for e in map(json.loads, lines) if e.get("rule") == "steer"]
    return [(e["step"], e["evidence"]["action"], e["evidence"]["value"]) for e in events]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_stop_checkpoint_and_lr_through_trainer_should_stop(
    tmp_path: Path, accumulate: int
) -> None:
    asks = {
        2: lambda mon: mon.set_lr(0.04),
        3: lambda mon: mon.checkpoint(),
        5: lambda mon: mon.stop(),
    }
    trainer, nb, asker = fit(tmp_path, asks, accumulate=accumulate)  # returns normally
    mon = nb.monitor
    assert mon is not None and not mon.errors
    assert trainer.global_step == 6 and not trainer.interrupted
    run = nbmonitor.open(mon.run_dir)
    assert run.status == "stopped"
    h = run.history()
    assert h["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert h["micro_batches"].tolist() == [accumulate] * 6

    # The lr: halved each step by StepLR; 0.04 from step 4 on (set at the end of step 3, after
    # the scheduler stepped), then halved from there: the scheduler did not put its own back.
    expected = [0.1, 0.05, 0.025, 0.04, 0.02, 0.01]
    np.testing.assert_allclose([asker.lrs[s] for s in range(1, 7)], expected, rtol=1e-9)
    np.testing.assert_allclose(h["lr"], expected, rtol=1e-6)

    # The checkpoint: Lightning's own, of step 4, resumable with fit(ckpt_path=...).
    ckpt = mon.run_dir / "checkpoints" / "step-4.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == 4
    assert steer_events(mon.run_dir) == [
        (3, "lr", 0.04),
        (4, "checkpoint", str(ckpt)),
        (6, "stop", None),
    ]
    resumed, nb2, _ = fit(
        tmp_path, {}, accumulate=accumulate, max_steps=7, ckpt_path=str(ckpt), runs="resumed"
    )
    assert resumed.global_step == 7 and nb2.monitor is not None
    assert nbmonitor.open(nb2.monitor.run_dir).history()["step"].tolist() == [5, 6, 7]


def test_a_pause_holds_the_trainer_until_stopped(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    holder: dict[str, Any] = {}

    def watch() -> None:
        assert wait_for(lambda: "nb" in holder and holder["nb"].monitor is not None)
        mon = holder["nb"].monitor
        assert wait_for(lambda: mon.steering.paused)
        assert mon.flush()  # the sampler stays live while the Trainer is held
        seen["steps"] = mon.history()["step"].tolist()
        seen["step"] = mon.step
        mon.stop()

    class Hold(NbmonitorCallback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            holder["nb"] = self
            super().on_train_start(trainer, pl_module)

    watcher = threading.Thread(target=watch)
    watcher.start()
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    nb = Hold(run_dir=tmp_path / "runs", display=False, interval=0.05)
    trainer = L.Trainer(
        max_steps=200, accelerator="cpu", callbacks=[nb, Asker(nb, {2: lambda m: m.pause()})],
        enable_progress_bar=False, logger=False, enable_checkpointing=False,
        enable_model_summary=False,
    )  # fmt: skip
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=4))
    watcher.join(60)
    assert seen == {"steps": [1, 2, 3], "step": 3}
    assert trainer.global_step == 3
    assert nb.monitor is not None and nbmonitor.open(nb.monitor.run_dir).status == "stopped"
    assert [(s, a) for s, a, _ in steer_events(nb.monitor.run_dir)] == [(3, "pause"), (3, "stop")]


def test_a_plain_attach_in_the_module_is_stopped_as_a_plain_loop(tmp_path: Path) -> None:
    # No callback: attach(self, ...) in the module. The stop is raised out of the optimizer's
    # step after the update, through Lightning's fit(), which ends with it (its on_exception
    # hooks run); the run is closed "stopped" before it is raised.
    class Plain(Regressor):
        mon: Any = None

        def on_train_start(self) -> None:
            self.mon = nbmonitor.attach(self, self.optimizers(), run_dir=tmp_path, display=False)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.trainer.global_step == 3:
                self.mon.stop()

    torch.manual_seed(0)
    x = torch.randn(64, 8)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    module = Plain()
    trainer = L.Trainer(
        max_steps=200, accelerator="cpu", enable_progress_bar=False, logger=False,
        enable_checkpointing=False, enable_model_summary=False,
    )  # fmt: skip
    with pytest.raises(nbmonitor.StopTraining) as stopped:
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    # Step 4's update was applied, but Lightning counts a step after its optimizer step
    # returns: its own global_step says 3 (docs/steering.md: use the callback).
    assert stopped.value.step == 4 and trainer.global_step == 3
    run = nbmonitor.open(module.mon.run_dir)
    assert run.status == "stopped" and run.history()["step"].tolist() == [1, 2, 3, 4]
