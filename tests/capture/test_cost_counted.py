"""What watching adds to each training step at defaults, counted, not timed (stable on any
machine, loaded or not): the torch operators nbmonitor dispatches (on a GPU each is a kernel
launch or a copy, ~5-10 us of host time), the Python calls it makes on the training thread,
the records it keeps and the hooks it installs. A change that adds to any of them fails here:
measure it (``python -m benchmarks.cost``), then raise the ceiling on purpose.
"""

from __future__ import annotations

import collections
import gc
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nbmonitor
from nbmonitor.records import PHASE_KEYS

# Past the layer and memory sampling of the first 100 steps (probes/base.py: due), and short
# of step 200, the next sampled one: the steady state.
WARMUP = 110
STEPS = 10
PACKAGE = str(Path(nbmonitor.__file__).parent)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.LayerNorm(16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 1),
    )


def _loop(
    tmp: Path, monitored: bool, *, log: bool = True, clip: bool = False
) -> tuple[Callable[[], None], Any]:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)
    mon = (
        nbmonitor.attach(model, opt, run_dir=tmp, display=False, interval=3600)
        if monitored
        else None
    )

    def step() -> None:
        loss = model(x).pow(2).mean()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mon is not None and log:
            mon.log(loss=loss)

    for _ in range(WARMUP):
        step()
    return step, mon


def _ops_added(tmp: Path, **kwargs: bool) -> collections.Counter[str]:
    counts = []
    for monitored in (False, True):
        step, mon = _loop(tmp / str(monitored), monitored, **kwargs)
        with _Ops() as mode:
            for _ in range(STEPS):
                step()
        if mon is not None:
            mon.close()
        counts.append(mode.ops)
    return counts[1] - counts[0]


# The ceilings: torch operators nbmonitor adds per step (the CPU paths; on a GPU the gradient
# norms are one _foreach_norm and a stack, and each value crosses in one non-blocking copy).
# Defaults: the norms (one _foreach_norm for the weights, its stack and one cat of the 1-D
# tensors) and the logged loss read once. The backward's root is kept as it is (no detach).
OPS_AT_DEFAULTS = 4
# A loop that logs no loss: the backward's root is read instead of the logged loss.
OPS_WITHOUT_LOG = 4
# clip_grad_norm_: its total read too.
OPS_WITH_CLIP = 5


@pytest.mark.parametrize(
    ("kwargs", "ceiling"),
    [({}, OPS_AT_DEFAULTS), ({"log": False}, OPS_WITHOUT_LOG), ({"clip": True}, OPS_WITH_CLIP)],
    ids=["defaults", "no-log", "clip"],
)
def test_torch_operators_added_per_step(
    tmp_path: Path, kwargs: dict[str, bool], ceiling: int
) -> None:
    added = _ops_added(tmp_path, **kwargs)
    per_step = sum(added.values()) / STEPS
    assert per_step <= ceiling, f"{per_step} ops per step: {dict(added)}"
    assert not +(collections.Counter() - added)  # nothing the plain loop does is missing


# Python calls into nbmonitor's code on the training thread per step, and the C functions
# (torch's included) those call: the measure of its Python work.
# The phase timer owns its state (one method a mark) and the step's one record is held for its
# loss (hold, fold_loss); the output-loss probe retires on a model that returns tensors. The
# clock calls the gradient-norm probe itself on a steady step (no dispatch loop), reads the
# forward's batch from its first tensor's shape, keeps the backward's root without a call,
# and drops it when the loop logs the step's loss (nothing for the next forward to release);
# the optimizer's pre-step hook does the step's pre-step work itself (no call of its own); the
# hooks write the phase marks' usual case out (PhaseTimer.fast: four calls less a step), the
# pre-step hook takes the norms' pass itself (GradNormProbe.pre_step's usual case) and the
# logged loss goes into the held row from the clock's log (Recorder.fold_loss's usual case),
# and the step's row is written by the step end itself (Recorder.end_step's usual case).
PY_CALLS_AT_DEFAULTS = 15
C_CALLS_AT_DEFAULTS = 27
# A loop that logs no loss: the root is released into a record by the next forward instead.
PY_CALLS_WITHOUT_LOG = 19
C_CALLS_WITHOUT_LOG = 31
# A loop that clips: the clip's two listeners call the norms' probe and read the total with
# their guards written out (37 calls before), and the pre-step hook then calls no probe.
PY_CALLS_WITH_CLIP = 24
C_CALLS_WITH_CLIP = 33


@pytest.mark.parametrize(
    ("log", "clip", "py_ceiling", "c_ceiling"),
    [
        (True, False, PY_CALLS_AT_DEFAULTS, C_CALLS_AT_DEFAULTS),
        (False, False, PY_CALLS_WITHOUT_LOG, C_CALLS_WITHOUT_LOG),
        (True, True, PY_CALLS_WITH_CLIP, C_CALLS_WITH_CLIP),
    ],
    ids=["defaults", "no-log", "clip"],
)
def test_python_calls_per_step(
    tmp_path: Path, log: bool, clip: bool, py_ceiling: int, c_ceiling: int
) -> None:
    step, mon = _loop(tmp_path, True, log=log, clip=clip)
    calls = collections.Counter[str]()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            calls["py"] += 1
            calls[f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"] += 1
        elif event == "c_call" and frame.f_code.co_filename.startswith(PACKAGE):
            calls["c"] += 1

    sys.setprofile(profile)
    try:
        for _ in range(STEPS):
            step()
    finally:
        sys.setprofile(None)
        mon.close()
    py, c = calls.pop("py") / STEPS, calls.pop("c") / STEPS
    top = dict(calls.most_common(40))
    assert py <= py_ceiling, f"{py} Python calls per step: {top}"
    assert c <= c_ceiling, f"{c} C calls per step from nbmonitor's code: {top}"
    # No probe dispatch on a step where only the gradient norms are due, and no call to keep
    # or drop the backward's root of a loop that logs its loss.
    assert "clock.py:_call" not in calls
    assert "backward_loss.py:started" not in calls
    assert "clock.py:_pre_step" not in calls
    assert "grad_norms.py:pre_step" not in calls and "recorder.py:fold_loss" not in calls
    assert "clock.py:_guarded" not in calls and "clock.py:_stepping" not in calls
    # The phase marks written out in the hooks (the backward's end is the gradient's own hook).
    assert not {"forward_start", "forward_ended", "optimizer_start", "step_end"} & {
        name.rsplit(":", 1)[-1] for name in calls if name.startswith("phases.py:")
    }
    if log:
        assert "backward_loss.py:release" not in calls
    if log and not clip:  # a row like the one before: written by the step end itself
        assert "recorder.py:end_step" not in calls


# Objects the garbage collector tracks that a step leaves behind (monitored minus plain, the
# sampler not draining): the phases' tuple, the one thing of its own a step keeps in its row of
# columns (no record, no DeviceValue: the norms are written into a HostRing row); temporaries
# do not count. Each one left alive until the sampler's tick counts towards the collections
# the loop pays, and is promoted by them (benchmarks/NOTES.md, "The garbage collector").
OBJECTS_KEPT_PER_STEP = 1


def _objects_kept(tmp: Path, monitored: bool) -> collections.Counter[str]:
    step, mon = _loop(tmp, monitored)
    gc.collect()
    gc.disable()  # nothing freed or untracked by a collection in between
    try:
        before = collections.Counter(type(o).__name__ for o in gc.get_objects())
        for _ in range(STEPS):
            step()
        after = collections.Counter(type(o).__name__ for o in gc.get_objects())
    finally:
        gc.enable()
        if mon is not None:
            mon.close()
    return after - before


def test_objects_kept_per_step(tmp_path: Path) -> None:
    plain = _objects_kept(tmp_path / "plain", False)
    kept = _objects_kept(tmp_path / "monitored", True) - plain
    per_step = sum(kept.values()) / STEPS
    assert per_step <= OBJECTS_KEPT_PER_STEP, f"{per_step} objects kept per step: {dict(kept)}"
    # The step's one row of columns (its phases and its loss folded in): no record a step.
    assert kept["StepRecord"] == kept["PhaseRecord"] == kept["LogRecord"] == 0
    assert kept["DeviceValue"] == kept["Tensor"] == 0


def test_records_and_hooks_at_defaults(tmp_path: Path) -> None:
    step, mon = _loop(tmp_path, True)
    clock = mon.internals.clock()
    clock.recorder.release()
    queue = clock.recorder._queue
    before, block = len(queue), clock.recorder.block
    assert block is not None and block is queue[-1]  # the steps go into columns
    rows = block.w
    for _ in range(STEPS):
        step()
    clock.recorder.release()  # the last step's row, held for a loss logged after it
    kinds = collections.Counter(type(r).__name__ for r in list(queue)[before:])
    model = clock._model_ref()
    opt = clock.optimizer
    modules = list(model.modules())
    hooks = {
        "forward_pre": sum(len(m._forward_pre_hooks) for m in modules),
        "forward": sum(len(m._forward_hooks) for m in modules),
        "backward": sum(len(m._backward_hooks) + len(m._backward_pre_hooks) for m in modules),
        "parameter": sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()),
        "tensor": sum(len(p._backward_hooks or {}) for p in model.parameters()),
        "optimizer": len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks),
    }
    mon.close()
    # One row of columns a step, no record: the step, its phases and the loss logged after it
    # folded in.
    assert kinds == {} and clock.recorder.block is block
    assert block.w == block.n == rows + STEPS
    assert block.phases is not None
    assert all(isinstance(block.loss[i], float) for i in range(rows, rows + STEPS))
    assert all(len(block.phases[i] or ()) == 5 for i in range(rows, rows + STEPS))
    # The root module's two hooks (per-module hooks only for sampled steps or opt-in probes),
    # the one gradient that marks the backward's end, the optimizer's two.
    assert hooks == {
        "forward_pre": 1,
        "forward": 1,
        "backward": 0,
        "parameter": 1,
        "tensor": 0,
        "optimizer": 2,
    }


# A CUDA step at defaults, on an unsampled step: the fused norm and its stack, the one copy of
# the norms and the loss into a pinned ring row, and that row's event (phase events only on one
# step in phases.DEVICE_EVERY). Counted on the CPU: the same path taken with plain memory and
# counted events (_CountedEvent), the model's parameters taken for a CUDA device's.
CUDA_OPS_PER_STEP = 3
CUDA_COPIES_PER_STEP = 1
CUDA_EVENTS_PER_STEP = 1
# Device-to-host copies, as torch's dispatch sees them: copies, and a scalar read (item()).
_COPIES = ("aten.copy_", "aten._to_copy", "aten._local_scalar_dense")


class _CountedEvent:
    """A CUDA event's interface on the CPU, counting its records."""

    recorded = 0

    def record(self) -> None:
        type(self).recorded += 1

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: _CountedEvent) -> float:
        return 0.0


def _as_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path on the CPU: deferred norms crossed through a ring of plain memory with
    counted events, and phases timed as on CUDA (events on one step in DEVICE_EVERY)."""
    import functools

    from nbmonitor._capture import phases
    from nbmonitor._capture.device_value import PinnedRing
    from nbmonitor._capture.probes import grad_norms

    replan = grad_norms.NormPass._replan

    def on_cuda(self: grad_norms.NormPass) -> None:
        replan(self)
        self.plan = None
        self.deferred = self._defer

    monkeypatch.setattr(grad_norms.NormPass, "_replan", on_cuda)
    monkeypatch.setattr(
        grad_norms, "PinnedRing", functools.partial(PinnedRing, pin=False, new_event=_CountedEvent)
    )
    init = phases.PhaseTimer.__init__

    def timed_as_on_cuda(self: Any, guard: Any, clock: Any, **kwargs: Any) -> None:
        init(self, guard, clock, cuda=True, new_event=_CountedEvent)

    monkeypatch.setattr(phases.PhaseTimer, "__init__", timed_as_on_cuda)


def _per_step(step: Callable[[], None], steps: int) -> list[tuple[collections.Counter[str], int]]:
    out = []
    for _ in range(steps):
        events = _CountedEvent.recorded
        with _Ops() as mode:
            step()
        out.append((mode.ops, _CountedEvent.recorded - events))
    return out


@pytest.mark.parametrize("log", [True, False], ids=["defaults", "no-log"])
def test_a_cuda_step_costs_one_fused_norm_one_copy_and_one_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: bool
) -> None:
    # A loop that logs no loss: the root its backward started from, read from the same copy.
    from nbmonitor._capture.phases import DEVICE_EVERY

    plain, _ = _loop(tmp_path / "plain", False)
    plain_ops = _per_step(plain, 1)[0][0]
    _as_on_cuda(monkeypatch)
    step, mon = _loop(tmp_path / "cuda", True, log=log)
    clock = mon.internals.clock()
    try:
        counted = _per_step(step, DEVICE_EVERY + 2)
        first = clock.step - len(counted) + 1
        mon.flush()
        h = mon.history()
    finally:
        mon.close()
    timed_on_device = 0
    for n, (ops, events) in enumerate(counted, start=first):
        added = ops - plain_ops
        copies = sum(added[name] for name in _COPIES)
        if n % DEVICE_EVERY == 0:  # the phases of this one timed with events
            assert events == CUDA_EVENTS_PER_STEP + 5, (n, events)
            timed_on_device += 1
            continue
        assert sum(added.values()) <= CUDA_OPS_PER_STEP, (n, dict(added))
        assert copies <= CUDA_COPIES_PER_STEP, (n, dict(added))
        assert events <= CUDA_EVENTS_PER_STEP, (n, events)
        assert not +(collections.Counter() - added)  # nothing the plain loop does is missing
    assert timed_on_device >= 1
    # And the numbers crossed: the norms' total, and the loss folded in from the same copy.
    assert np.isfinite(h["grad_norm"][-len(counted) :]).all()
    assert np.isfinite(h["loss"][-len(counted) :]).all()
    assert all(np.isfinite(h[key][-len(counted) :]).all() for key in PHASE_KEYS[1:])
