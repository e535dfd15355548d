"""The Hugging Face Trainer callback: a real Trainer (tiny GPT-2 built from a config, no
downloads) with gradient accumulation, clipping and evaluation; nbmonitor's steps, loss,
grad_norm and lr equal what the Trainer logged per step (logging_steps=1)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.hf_setup import quiet_args, tiny_gpt2  # noqa: E402

from nbmonitor.integrations.hf import NbmonitorCallback  # noqa: E402


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, 16), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@pytest.mark.timeout(300)
def test_trainer_steps_loss_grad_norm_and_lr_match_its_log(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tiny_gpt2(32, 2)
    args = quiet_args(
        tmp_path,
        max_steps=6,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=5e-2,  # large, so that the clip (max_grad_norm=0.5) acts
        max_grad_norm=0.5,
        lr_scheduler_type="cosine",
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=3,
        per_device_eval_batch_size=4,
    )
    callback = NbmonitorCallback(run_dir=tmp_path / "runs", display=False)
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(48, 1),
        eval_dataset=Tokens(8, 2),
        callbacks=[callback],
    )
    trainer.train()
    mon = callback.monitor
    assert mon is not None and mon.status == "closed"
    logged = [e for e in trainer.state.log_history if "loss" in e and "grad_norm" in e]
    h = mon.history()
    assert h["step"].tolist() == [e["step"] for e in logged] == list(range(1, 7))
    assert mon.step == trainer.state.global_step == 6  # evaluation is not counted
    np.testing.assert_allclose(h["loss"], [e["loss"] for e in logged], rtol=1e-4)
    np.testing.assert_allclose(h["grad_norm"], [e["grad_norm"] for e in logged], rtol=1e-4)
    np.testing.assert_allclose(h["lr"], [e["learning_rate"] for e in logged], rtol=1e-6)
    assert (h["grad_clip_coef"] < 1).any()
    assert h["micro_batches"].tolist() == [2] * 6


@pytest.mark.timeout(300)
def test_attach_before_train_adopts_the_optimizer_the_trainer_builds(tmp_path: Path) -> None:
    # The Trainer builds its optimizer inside train(): attach(model) before it adopts that
    # optimizer at its first step, so steps are the Trainer's, and grad_norm its clip's.
    import nbmonitor

    torch.manual_seed(0)
    model = tiny_gpt2(32, 2)
    args = quiet_args(
        tmp_path,
        max_steps=5,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        max_grad_norm=0.5,
        logging_steps=1,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(48, 1))
    with nbmonitor.attach(model, run_dir=tmp_path / "runs", display=False) as mon:
        trainer.train()
        assert mon.flush()
        h = mon.history()
    logged = [e for e in trainer.state.log_history if "grad_norm" in e]
    assert mon.step == trainer.state.global_step == 5
    assert h["step"].tolist() == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(h["grad_norm"], [e["grad_norm"] for e in logged], rtol=1e-4)
    np.testing.assert_allclose(h["lr"][1:], [e["learning_rate"] for e in logged][1:], rtol=1e-6)


@pytest.mark.timeout(300)
def test_attach_before_train_with_accumulation_counts_the_trainers_steps(tmp_path: Path) -> None:
    # The optimizer is adopted at its first step, after that step's micro-batches: 30 of the
    # Trainer's steps are 30 steps (the micro-batches before adoption once counted as one more).
    import nbmonitor

    torch.manual_seed(0)
    model = tiny_gpt2()
    args = quiet_args(
        tmp_path,
        max_steps=30,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_grad_norm=0.5,
        logging_steps=1,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(120, 1))
    with nbmonitor.attach(model, run_dir=tmp_path / "runs", display=False) as mon:
        trainer.train()
        assert mon.flush()
        h = mon.history()
    logged = [e for e in trainer.state.log_history if "grad_norm" in e]
    assert mon.step == trainer.state.global_step == 30
    assert h["step"].tolist() == [e["step"] for e in logged] == list(range(1, 31))
    assert h["micro_batches"].tolist() == [2] * 30
    np.testing.assert_allclose(h["grad_norm"], [e["grad_norm"] for e in logged], rtol=1e-4)
    np.testing.assert_allclose(h["loss"], [e["loss"] for e in logged], rtol=1e-4)


@pytest.mark.timeout(300)
def test_a_run_resumed_from_a_checkpoint_says_its_own_steps(tmp_path: Path) -> None:
    # Trained to step 10 and saved; resumed to step 30 by a new Trainer: the resumed run holds
    # steps 11..30, and its meta.json says 20 steps (it said 30), its last step 30.
    import json

    import nbmonitor
    from nbmonitor.runs import list_runs

    def trainer(max_steps: int, runs: Path) -> tuple[transformers.Trainer, NbmonitorCallback]:
        torch.manual_seed(0)
        args = quiet_args(
            tmp_path,
            max_steps=max_steps,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            logging_steps=1,
            save_strategy="steps",
            save_steps=10,
        )
        callback = NbmonitorCallback(run_dir=runs, display=False)
        model = tiny_gpt2()
        data = Tokens(120, 1)
        return transformers.Trainer(model, args, train_dataset=data, callbacks=[callback]), callback

    first, _ = trainer(10, tmp_path / "first")
    first.train()
    resumed, callback = trainer(30, tmp_path / "runs")
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-10"))
    mon = callback.monitor
    assert mon is not None and mon.status == "closed"
    assert resumed.state.global_step == mon.step == 30
    history = nbmonitor.open(mon.run_dir).history()
    assert history["step"].tolist() == list(range(11, 31))
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert (meta["steps"], meta["last_step"], meta["attach"]["start_step"]) == (20, 30, 10)
    assert [row["steps"] for row in list_runs(tmp_path / "runs")] == [20]
    # The options and the rules' thresholds in force, every field.
    assert meta["attach"]["total_steps"] == 30 and meta["attach"]["interval"] == mon.interval
    assert meta["thresholds"] == dataclasses.asdict(nbmonitor.Thresholds())
