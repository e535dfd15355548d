"""attach() takes a framework's wrapped optimizer (its ``.optimizer``), rejects anything else in
one line, and a failure inside attach leaves no hook behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import mlp, train

import nbmonitor
from nbmonitor._capture import intercept
from nbmonitor._engine.sampler import SamplerThread


class AcceleratedLike(torch.optim.Optimizer):
    """Like Accelerate's AcceleratedOptimizer: an Optimizer subclass that never ran
    Optimizer.__init__ and forwards to the optimizer it wraps."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)


class LightningLike:
    """Like Lightning's LightningOptimizer: not an Optimizer, the torch one as ``.optimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def step(self) -> None:
        self._optimizer.step()

    def zero_grad(self) -> None:
        self._optimizer.zero_grad()


@pytest.mark.parametrize("wrapper", [AcceleratedLike, LightningLike])
def test_a_wrapped_optimizer_is_unwrapped(wrapper: Any, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    wrapped = wrapper(inner)
    mon = nbmonitor.attach(model, wrapped, run_dir=tmp_path, display=False)
    try:
        train(model, wrapped, mon, steps=3, accumulate=2)
        mon.flush()
        h = mon.history()
        assert h["step"].tolist() == [1, 2, 3]  # optimizer steps, not micro-batches
        assert h["micro_batches"].tolist() == [2, 2, 2]
        assert h["lr"].tolist() == [0.01] * 3
    finally:
        mon.close()


def test_anything_else_gets_the_one_line_error(tmp_path: Path) -> None:
    class NotAWrapper:
        optimizer = "sgd"

    with pytest.raises(TypeError, match=r"optimizer must be a torch.optim.Optimizer") as info:
        nbmonitor.attach(mlp(), NotAWrapper(), run_dir=tmp_path, display=False)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def all_hooks(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    n = sum(
        len(m._forward_pre_hooks) + len(m._forward_hooks) + len(m._backward_hooks)
        for m in model.modules()
    )
    n += len(optimizer._optimizer_step_pre_hooks) + len(optimizer._optimizer_step_post_hooks)
    return n + intercept.listening()


@pytest.mark.parametrize("where", ["sampler_start", "clock_install"])
def test_a_failure_inside_attach_leaves_no_hook(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def boom(*args: object) -> None:
        raise RuntimeError("injected")

    if where == "sampler_start":
        # After every hook is installed.
        monkeypatch.setattr(SamplerThread, "start", boom)
    else:
        # Halfway through: the per-module probes' hooks are in, the clock's root hooks not.
        from nbmonitor._capture.clock import StepClock

        monkeypatch.setattr(StepClock, "_forward_pre", property(boom))
    with pytest.raises(RuntimeError, match="injected"):
        nbmonitor.attach(
            model, opt, run_dir=tmp_path, display=False, activations=True, check_forward=True
        )
    assert all_hooks(model, opt) == 0
    assert torch.nn.utils.clip_grad_norm_ is intercept._ORIGINAL_CLIP
