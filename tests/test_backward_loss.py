"""The loss in a loop that logs none: the value of what the step's backward passes started from,
added up over its micro-batches, before a GradScaler's scaling (nanoGPT's model returns
``(logits, loss)``, which carries no ``.loss``). The references are the loop's own tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import nbmonitor
from nbmonitor._capture import intercept


class TupleGPT(torch.nn.Module):
    """Returns ``(logits, loss)`` as karpathy/nanoGPT's GPT does."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.head = torch.nn.Linear(16, 32)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.head(self.emb(idx))
        if targets is None:
            return logits, None
        loss = torch.nn.functional.cross_entropy(logits.view(-1, 32), targets.view(-1))
        return logits, loss


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, 32, (4, 8), generator=gen)
    return x, torch.roll(x, 1, dims=1)


@pytest.mark.parametrize("accumulation", [1, 4])
@pytest.mark.parametrize("scaler", [False, True])
def test_a_nanogpt_loop_has_its_loss_without_log(
    tmp_path: Path, accumulation: int, scaler: bool
) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = TupleGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # A scale far from 1: a loss read after scaling would be 1024 times too large.
    amp = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=scaler)
    want = []
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(6):
            total = 0.0
            for _ in range(accumulation):
                _, loss = model(*batch(gen))
                assert loss is not None
                loss = loss / accumulation  # as nanoGPT's train.py scales it
                total += loss.item()
                amp.scale(loss).backward()
            amp.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            amp.step(opt)
            amp.update()
            opt.zero_grad(set_to_none=True)
            want.append(total)
            with torch.no_grad():  # an evaluation forward between steps adds nothing
                model(*batch(gen))
        assert mon.flush()
        h = mon.history()
    assert h["step"].tolist() == list(range(1, 7))
    np.testing.assert_allclose(h["loss"], want, rtol=1e-6)


def test_torch_autograd_backward_and_the_logged_loss_first(tmp_path: Path) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = TupleGPT()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    want = []
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for step in range(4):
            _, loss = model(*batch(gen))
            assert loss is not None
            aux = loss * 0.5
            torch.autograd.backward([loss, aux])  # two roots: both are what was trained on
            opt.step()
            opt.zero_grad()
            if step == 2:
                mon.log(loss=7.0)  # an explicit value is the step's loss
                want.append(7.0)
            else:
                want.append(loss.item() * 1.5)
        assert mon.flush()
        h = mon.history()
    np.testing.assert_allclose(h["loss"], want, rtol=1e-6)


def test_without_an_optimizer_each_backward_is_a_step_with_its_loss(tmp_path: Path) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = TupleGPT()
    want = []
    with nbmonitor.attach(model, run_dir=tmp_path, display=False) as mon:
        for _ in range(3):
            _, loss = model(*batch(gen))
            assert loss is not None
            loss.backward()
            want.append(loss.item())
            # A backward of something else between steps (no forward of the model) is not a loss.
            torch.ones(1, requires_grad=True).sum().backward()
            model.zero_grad()  # by hand: the gradients reset between steps
        assert mon.flush()
        h = mon.history()
    assert h["step"].tolist() == [1, 2, 3]
    np.testing.assert_allclose(h["loss"], want, rtol=1e-6)


def test_accelerate_backward(tmp_path: Path) -> None:
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = TupleGPT()
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-2))
    want, micro = [], []
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(8):  # 4 optimizer steps of 2 micro-batches
            with accelerator.accumulate(model):
                _, loss = model(*batch(gen))
                micro.append(loss.item())
                accelerator.backward(loss)  # divides by the accumulation count for backward
                opt.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                want.append(sum(micro) / 2)
                micro = []
        assert mon.flush()
        h = mon.history()
    assert h["step"].tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(h["loss"], want, rtol=1e-6)


def test_accelerate_a_short_last_step_shows_the_mean_of_its_losses(tmp_path: Path) -> None:
    # 9 batches an epoch, gradient_accumulation_steps=2: each epoch's last step has one
    # micro-batch, which accelerator.backward divides by 2 all the same. The loss shown is the
    # mean of the losses given to accelerator.backward over each step, the short ones included.
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    xs = torch.randint(0, 32, (36, 8), generator=gen)
    data = torch.utils.data.TensorDataset(xs, torch.roll(xs, 1, dims=1))
    model = TupleGPT()
    model, opt, loader = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=1e-2), torch.utils.data.DataLoader(data, 4)
    )
    want: list[float] = []
    micro: list[float] = []
    counts: list[int] = []
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(2):
            for x, y in loader:
                with accelerator.accumulate(model):
                    _, loss = model(x, y)
                    micro.append(loss.item())
                    accelerator.backward(loss)
                    opt.step()
                    opt.zero_grad()
                if accelerator.sync_gradients:
                    want.append(sum(micro) / len(micro))
                    counts.append(len(micro))
                    micro = []
        assert mon.flush()
        h = mon.history()
    assert counts == [2, 2, 2, 2, 1] * 2
    assert h["step"].tolist() == list(range(1, 11))
    np.testing.assert_allclose(h["loss"], want, rtol=1e-6)


def test_the_wrappers_leave_with_the_last_monitor(tmp_path: Path) -> None:
    model = TupleGPT()
    with nbmonitor.attach(model, run_dir=tmp_path, display=False):
        assert torch.autograd.backward is intercept.backward
        assert torch.amp.GradScaler.scale is intercept.scaler_scale
    assert intercept.listening() == 0
    assert torch.autograd.backward is intercept._ORIGINAL_BACKWARD
    assert torch.amp.GradScaler.scale is intercept._ORIGINAL_SCALER_SCALE


def _backward_records(mon: nbmonitor.Monitor) -> list[int]:
    """The steps of the backward-loss records waiting in the monitor's recorder (its sampler
    is paused by a long interval)."""
    from nbmonitor.records import FROM_BACKWARD, LogRecord

    clock = mon.internals.clock()
    assert clock is not None
    queue = clock.recorder._queue
    return [r.step for r in queue if isinstance(r, LogRecord) and r.source == FROM_BACKWARD]


def test_a_loop_that_logs_its_loss_costs_no_read_of_the_backward_roots(tmp_path: Path) -> None:
    # Counted: a logged loss makes the backward's copy of it useless (one device-to-host copy
    # and event per step on a GPU); only the steps the loop did not log get one.
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    want = {}
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=3600) as mon:
        for step in range(1, 9):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            want[step] = loss.item()
            if step % 2 == 0:
                mon.log(loss=loss)
        # Kept until the next micro-batch, then read: step 7's by step 8's forward.
        assert _backward_records(mon) == [1, 3, 5, 7]
        last = model(torch.randn(8, 4)).pow(2).mean()
        last.backward()  # step 9's, read at flush
        want[9] = last.item()
        mon.flush()
        history = mon.history()
    assert history["loss"].tolist() == pytest.approx([want[s] for s in range(1, 10)])


def test_a_loss_changed_in_place_before_it_is_read_is_not_recorded(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=3600) as mon:
        for step in range(2):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step == 0:
                loss.detach().zero_()  # the value the backward started from is gone
        mon.flush()
        assert _backward_records(mon) == []  # flushed: step 2's went to the sampler
        history = mon.history()
    assert np.isnan(history["loss"][0]) and np.isfinite(history["loss"][1])
