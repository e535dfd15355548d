"""The loss of every step of a Hugging Face Trainer run is what the Trainer logs for that step at
``logging_steps=1``, with gradient accumulation, with and without ``num_items_in_batch``, on
padded batches whose token counts vary; with ``logging_steps=5`` the Trainer's logged window
averages are the means of nbmonitor's per-step losses (never mixed into them). The references
are the Trainer's own logs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.hf_setup import quiet_args, tiny_gpt2  # noqa: E402

from nbmonitor.integrations.hf import NbmonitorCallback  # noqa: E402


class Ragged(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Sequences of 3 to 16 tokens: padded batches whose token counts differ."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        lengths = torch.randint(3, 17, (n,), generator=gen).tolist()
        self.ids = [torch.randint(1, 64, (k,), generator=gen) for k in lengths]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i]}


def pad(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    n = max(len(item["input_ids"]) for item in items)
    ids = torch.zeros(len(items), n, dtype=torch.long)
    labels = torch.full((len(items), n), -100, dtype=torch.long)
    mask = torch.zeros(len(items), n, dtype=torch.long)
    for row, item in enumerate(items):
        k = len(item["input_ids"])
        ids[row, :k] = labels[row, :k] = item["input_ids"]
        mask[row, :k] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def train(tmp_path: Path, accumulation: int, num_items: bool, logging_steps: int) -> tuple:
    torch.manual_seed(0)
    model = tiny_gpt2()
    steps = 10
    args = quiet_args(
        tmp_path,
        max_steps=steps,
        per_device_train_batch_size=3,
        gradient_accumulation_steps=accumulation,
        learning_rate=1e-2,
        logging_steps=logging_steps,
    )
    callback = NbmonitorCallback(run_dir=tmp_path / "runs", display=False)
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=Ragged(3 * accumulation * steps, 1),
        data_collator=pad,
        callbacks=[callback],
    )
    # GPT-2 takes num_items_in_batch (its loss is then a share of the step's); without it the
    # Trainer divides each micro-batch's mean loss by the accumulation count instead.
    trainer.model_accepts_loss_kwargs = num_items
    trainer.train()
    mon = callback.monitor
    assert mon is not None and mon.status == "closed"
    logged = [e for e in trainer.state.log_history if "loss" in e and "grad_norm" in e]
    return mon.history(), logged


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("accumulation", "num_items", "logging_steps"),
    [(1, True, 1), (2, True, 1), (4, True, 5), (2, False, 1), (4, False, 1), (1, False, 5)],
)
def test_every_steps_loss_is_the_trainers(
    tmp_path: Path, accumulation: int, num_items: bool, logging_steps: int
) -> None:
    h, logged = train(tmp_path, accumulation, num_items, logging_steps)
    assert h["step"].tolist() == list(range(1, 11))
    assert h["micro_batches"].tolist() == [accumulation] * 10
    assert [e["step"] for e in logged] == list(range(logging_steps, 11, logging_steps))
    if logging_steps == 1:
        np.testing.assert_allclose(h["loss"], [e["loss"] for e in logged], rtol=1e-5)
    else:
        # The Trainer logs the mean over its window; nbmonitor keeps each step's own loss.
        windows = h["loss"].reshape(-1, logging_steps)
        np.testing.assert_allclose(windows.mean(axis=1), [e["loss"] for e in logged], rtol=1e-5)
        assert np.ptp(windows[0]) > 0  # per-step values, not the window's average repeated
    assert np.all(np.isfinite(h["loss"]))
