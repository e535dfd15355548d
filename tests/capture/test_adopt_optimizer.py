"""attach(model) without an optimizer adopts the first optimizer that steps the model's
parameters (torch's global optimizer step hooks): steps are its steps even when it is created
after attach; its first step includes the backward passes before it (gradient accumulation);
another model's optimizer is not adopted; before one steps, backward passes whose gradients are
reset are steps; the global hook holds the monitor weakly and is gone after close."""

from __future__ import annotations

import gc
import math
import threading
import weakref
from pathlib import Path

import numpy as np
import torch
from tests.helpers import mlp, wait_for

import nbmonitor
from nbmonitor._capture import adopt, intercept


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, clip: float | None = None) -> float:
    loss = model(torch.randn(4, 8)).pow(2).mean() * 100
    loss.backward()
    total = float("nan")
    if clip is not None:
        total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
    opt.step()
    opt.zero_grad()
    return total


def test_an_optimizer_created_after_attach_is_adopted(tmp_path: Path) -> None:
    before = adopt.watching(), intercept.listening()
    torch.manual_seed(0)
    model, other = mlp(), mlp()
    mon = nbmonitor.attach(model, run_dir=tmp_path, display=False)
    try:
        # Another model's optimizer steps first each time: it is not the model's.
        other_opt = torch.optim.SGD(other.parameters(), lr=0.5)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        totals = []
        for _ in range(5):
            step(other, other_opt)
            totals.append(step(model, opt, clip=0.1))
        assert mon.flush()
        h = mon.history()
        assert mon.step == 5 and h["step"].tolist() == [1, 2, 3, 4, 5]
        assert h["micro_batches"].tolist() == [1] * 5
        # The steps after the adopting one carry its learning rate, not the other's.
        np.testing.assert_allclose(h["lr"][1:], 0.01)
        # Pre-clip, the first step (ended by its backward pass) included.
        np.testing.assert_allclose(h["grad_norm"], totals, rtol=1e-4)
    finally:
        mon.close()
    assert (adopt.watching(), intercept.listening()) == before


def test_backward_passes_are_steps_until_an_optimizer_steps(tmp_path: Path) -> None:
    model = mlp()
    mon = nbmonitor.attach(model, run_dir=tmp_path, display=False)
    try:
        for _ in range(3):  # plain SGD by hand
            model(torch.randn(4, 8)).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad  # type: ignore[operator]
                    p.grad = None
        assert mon.step == 3
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(4):
            step(model, opt)
        # The adopting step's backward pass was counted as that step: not counted twice.
        assert mon.step == 7
        assert mon.flush()
        assert mon.history()["step"].tolist() == list(range(1, 8))
    finally:
        mon.close()


def test_the_global_hook_holds_the_monitor_weakly(tmp_path: Path) -> None:
    before = adopt.watching()
    model = mlp()
    mon = nbmonitor.attach(model, run_dir=tmp_path, display=False, interval=0.05)
    assert adopt.watching() == before + 1
    model_ref = weakref.ref(model)
    del model
    gc.collect()
    assert model_ref() is None  # the global hook did not keep it
    assert wait_for(lambda: mon.status == "closed")
    # Released from the nbmonitor-release thread: the global hook is left inert, then removed
    # by the next attach (on this thread).
    assert adopt.watching() == before + 1
    other = mlp()
    torch.optim.SGD(other.parameters(), lr=0.01).step()  # the inert hook does nothing
    mon2 = nbmonitor.attach(other, run_dir=tmp_path, display=False, interval=0.05)
    assert adopt.watching() == before + 1  # the new monitor's only
    mon2.close()
    assert adopt.watching() == before


def test_a_release_on_another_thread_never_breaks_an_optimizer_step_in_progress(
    tmp_path: Path,
) -> None:
    # torch iterates the global hooks during every optimizer step: a monitor released on
    # another thread right then must not remove its hook under it (RuntimeError in the loop).
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    before = adopt.watching()
    model = mlp()
    mon = nbmonitor.attach(model, run_dir=tmp_path, display=False, interval=0.05)
    released = threading.Event()

    def blocker(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        # Runs after nbmonitor's global hook, inside the same iteration.
        thread = threading.Thread(target=lambda: (mon.close(), released.set()))
        thread.start()
        thread.join(10)

    handles = [
        register_optimizer_step_pre_hook(blocker),
        # Another global hook after it: torch's iteration goes on past the release.
        register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: None),
    ]
    try:
        other = mlp()
        torch.optim.SGD(other.parameters(), lr=0.01).step()  # must not raise
        assert released.is_set() and mon.status == "closed"
    finally:
        for handle in handles:
            handle.remove()
    adopt.purge()
    assert adopt.watching() == before


def test_attach_with_an_optimizer_installs_no_global_hook(tmp_path: Path) -> None:
    before = adopt.watching()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False):
        assert adopt.watching() == before


def accumulate(model: torch.nn.Module, opt: torch.optim.Optimizer, micro: int) -> int:
    """One optimizer step over ``micro`` micro-batches; returns the samples it saw."""
    for _ in range(micro):
        (model(torch.randn(4, 8)).pow(2).mean() / micro).backward()
    opt.step()
    opt.zero_grad()
    return 4 * micro


def test_an_adopted_optimizer_under_accumulation_counts_its_steps(tmp_path: Path) -> None:
    # The optimizer's first step is adopted after its micro-batches' backward passes: they are
    # that step's, not steps of their own (30 optimizer steps are 30 steps, not 31).
    for micro in (2, 4):
        model = mlp()
        mon = nbmonitor.attach(model, run_dir=tmp_path, display=False)
        try:
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            calls: list[int] = []
            opt.register_step_post_hook(lambda *a, calls=calls: calls.append(1))
            samples = [accumulate(model, opt, micro) for _ in range(30)]
            assert mon.step == len(calls) == 30
            assert mon.flush()
            h = mon.history()
            assert h["step"].tolist() == list(range(1, 31))
            assert h["micro_batches"].tolist() == [micro] * 30
            assert h["samples"].tolist() == samples
        finally:
            mon.close()


def test_an_existing_optimizer_adopted_mid_run_under_accumulation(tmp_path: Path) -> None:
    # attach after some steps of a loop that already has its optimizer (not passed to attach).
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        accumulate(model, opt, 3)
    with nbmonitor.attach(model, run_dir=tmp_path, display=False) as mon:
        for _ in range(7):
            accumulate(model, opt, 3)
        assert mon.step == 7
        assert mon.flush()
        assert mon.history()["micro_batches"].tolist() == [3] * 7


def test_backward_passes_reset_in_place_or_never_stepped_are_steps(tmp_path: Path) -> None:
    # By hand, gradients zeroed in place (zero_grad(set_to_none=False)): each pass is a step.
    model = mlp()
    with nbmonitor.attach(model, run_dir=tmp_path, display=False) as mon:
        for _ in range(4):
            model.zero_grad(set_to_none=False)
            model(torch.randn(4, 8)).pow(2).mean().backward()
        # The first pass was held until the second forward saw its gradients zeroed; the
        # loop is then known to step by hand, and each pass ends its step at once.
        assert mon.step == 4
    assert nbmonitor.open(mon.run_dir).history()["micro_batches"].tolist() == [1] * 4
    # One pass, then the run ends: the pass held is the run's one step.
    model = mlp()
    with nbmonitor.attach(model, run_dir=tmp_path, display=False) as mon:
        model(torch.randn(4, 8)).pow(2).mean().backward()
        assert mon.step == 0
    assert mon.step == 1
    assert nbmonitor.open(mon.run_dir).history()["step"].tolist() == [1]


def test_an_optimizer_first_seen_in_a_skipped_scaler_step_is_adopted_there(
    tmp_path: Path,
) -> None:
    # A GradScaler skips the first step (inf gradients): the optimizer's own hooks never run
    # then. It is adopted at the scaler's step, which counts as one step of its micro-batches
    # (skipped), as the HF Trainer counts it.
    model = mlp()
    with nbmonitor.attach(model, run_dir=tmp_path, display=False) as mon:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        skipped = []
        for i in range(6):
            for _ in range(2):
                loss = model(torch.randn(4, 8)).pow(2).mean()
                scaler.scale(loss * (math.inf if i == 0 else 1.0)).backward()
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped.append(scaler.get_scale() < before)
            opt.zero_grad()
        assert skipped == [True] + [False] * 5
        assert mon.step == 6
        assert mon.flush()
        h = mon.history()
        assert h["micro_batches"].tolist() == [2] * 6
        assert np.nan_to_num(h["step_skipped"]).tolist() == [1.0] + [0.0] * 5
