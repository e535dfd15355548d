"""What the training thread skips at every step, and that the numbers stay right: sampled probes
called on their steps only, learning rates read again only when they change, the backward's root
kept without a torch call, the forward's inputs read in a few calls."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import nbmonitor
from nbmonitor._capture import intercept
from nbmonitor._capture.device_value import HostRing
from nbmonitor._capture.inputs import batch_size, forward_counts, token_count
from nbmonitor._capture.probes.base import due, due_thin, next_due
from nbmonitor._capture.probes.memory import MemoryProbe
from nbmonitor._capture.probes.update_ratio import UpdateRatioProbe
from nbmonitor._capture.recorder import make_log_record
from nbmonitor.records import LOGGED, AuxRecord, LogRecord, MemoryRecord, Record, StepRecord

# A monitor, its model and optimizer, and the records its training thread put.
Watched = tuple[Any, torch.nn.Module, torch.optim.Optimizer, list[Record]]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


@pytest.fixture
def watched(
    tmp_path: Path,
) -> Iterator[Watched]:
    """A monitor (no ticks) and every record its training thread puts (or ends a step with,
    Recorder.end_step, as a StepRecord), in order."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = nbmonitor.attach(
        model, opt, run_dir=tmp_path, display=False, interval=3600, layer_every=50
    )
    recorder = mon.internals.clock().recorder
    put = recorder.put
    seen: list[Record] = []

    def keep(record: Record) -> None:
        seen.append(record)
        put(record)

    end_step = recorder.end_step

    def ended(*fields: Any) -> None:
        # A step's values, as the StepRecord they would be (whether they go as one or as a
        # row of columns); gradient values in a HostRing row copied as they stand.
        norms = fields[6]
        value = norms.value() if isinstance(norms, HostRing) else norms
        seen.append(StepRecord(*fields[:6], value, *fields[7:]))
        end_step(*fields)

    recorder.put = keep
    recorder.end_step = ended
    try:
        yield mon, model, opt, seen
    finally:
        mon.close()


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, **backward: bool) -> torch.Tensor:
    loss = model(torch.ones(2, 4)).pow(2).mean()
    loss.backward(**backward)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


@pytest.mark.parametrize("every", [1, 7, 10, 50, 200])
def test_next_due_is_the_first_step_due_takes(every: int) -> None:
    for step in range(1, 700):
        first = step
        while not due(first, every):
            first += 1
        assert next_due(step, every) == first


@pytest.mark.parametrize("every", [1, 3, 7, 10, 50, 100, 200])
def test_the_thin_schedule_is_inside_the_sampled_one(every: int) -> None:
    # The clock calls a sampled probe on the steps due() takes: a probe on the thinner
    # schedule (memory) must find its steps among them, and its first steps all there.
    thin = [s for s in range(1, 700) if due_thin(s, every)]
    assert all(due(s, every) for s in thin)
    assert thin[:2] == [1, 2]
    assert all(s in thin for s in range(every, 700, every))
    if every >= 3:  # no early step beyond the first two: a short run pays what a long one does
        assert thin == [1, 2, *range(every, 700, every)]
    if every >= 100:  # a 200-step run at the default layer_every: 4 breakdowns, not 24
        assert len([s for s in thin if s <= 200]) == (4 if every == 100 else 3)


def test_sampled_probes_are_called_on_their_steps_only(
    watched: Watched,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mon, model, opt, seen = watched
    calls: dict[str, list[int]] = {"memory": [], "update_ratio": []}
    clock = mon.internals.clock()
    for probe in clock.probes:
        if isinstance(probe, (MemoryProbe, UpdateRatioProbe)):
            original = probe.post_step

            def counted(ctx: Any, _name: str = probe.name, _f: Any = original) -> None:
                calls[_name].append(ctx.step + 1)
                _f(ctx)

            monkeypatch.setattr(probe, "post_step", counted)
    clock._plan_calls()  # the patched methods, bound again
    for _ in range(260):
        _step(model, opt)
    sampled = [s for s in range(1, 261) if due(s, 50)]
    # The early samples thin out (4 a doubling of the step count, up to step 100), then every 50.
    assert sampled[-10:] == [48, 50, 56, 64, 80, 96, 100, 150, 200, 250]
    # Called on the sampled steps and no other; and still measured on each of them.
    assert calls == {"memory": sampled, "update_ratio": sampled}
    assert [r.step for r in seen if isinstance(r, AuxRecord) and r.kind == "update"] == sampled
    # The memory breakdown thinner still: the first 2 steps, then every 50 (the clock calls
    # it on the sampled steps; it measures on these).
    thin = [s for s in sampled if due_thin(s, 50)]
    assert thin == [1, 2, 50, 100, 150, 200, 250]
    assert [r.breakdown.step for r in seen if isinstance(r, MemoryRecord)] == thin
    assert [r.step for r in seen if isinstance(r, StepRecord)] == list(range(1, 261))


def test_learning_rates_follow_a_scheduler_and_a_tensor_changed_in_place(
    watched: Watched,
) -> None:
    _, model, opt, seen = watched
    for _ in range(3):
        _step(model, opt)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        _step(model, opt)
        scheduler.step()
    for _ in range(2):
        _step(model, opt)
    opt.param_groups[0]["lr"] = torch.tensor(0.25)
    _step(model, opt)
    opt.param_groups[0]["lr"].fill_(0.125)  # in place: the same object, a new value
    _step(model, opt)
    steps = [r for r in seen if isinstance(r, StepRecord)]
    lrs = [r.lrs[0] if isinstance(r.lrs[0], float) else r.lrs[0].values()[0] for r in steps]
    assert lrs == [0.1, 0.1, 0.1, 0.1, 0.05, 0.025, 0.0125, 0.0125, 0.25, 0.125]
    # Unchanged Python numbers: the same tuple again, nothing new made for it.
    assert steps[0].lrs is steps[1].lrs is steps[2].lrs
    assert steps[3].lrs is not steps[4].lrs


def test_the_backward_root_is_kept_as_it_is_unless_the_graph_is_kept(
    watched: Watched,
) -> None:
    mon, model, opt, _ = watched
    loss_module = mon.internals.clock()._loss
    loss = model(torch.ones(2, 4)).pow(2).mean()
    loss.backward()
    ((_, kept, _),) = loss_module.pending
    assert kept is loss  # no detach() (a torch call) at each backward
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss = model(torch.ones(2, 4)).pow(2).mean()
    loss.backward(retain_graph=True)
    ((_, kept, _),) = loss_module.pending
    # The graph's saved tensors outlive this backward: nbmonitor must not hold them.
    assert kept is not loss and kept.grad_fn is None and not kept.requires_grad
    assert kept.item() == loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
    mon.flush()
    losses = mon.history()["loss"].tolist()
    assert len(losses) == 2 and losses[1] == pytest.approx(loss.item())


def test_the_root_of_a_backward_that_raised_is_detached(watched: Watched) -> None:
    """An out-of-memory error inside backward() leaves the graph's saved tensors unfreed: the
    root nbmonitor keeps must not hold them (mon.free_oom() frees what the error holds)."""
    mon, model, opt, _ = watched

    def out_of_memory(grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA out of memory (a stand-in)")

    def fail_in_backward(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        output.register_hook(out_of_memory)

    handle = model[0].register_forward_hook(fail_in_backward)
    loss = model(torch.ones(2, 4)).pow(2).mean()
    handle.remove()
    with pytest.raises(RuntimeError, match="a stand-in"):
        loss.backward()
    ((_, kept, _),) = mon.internals.clock()._loss.pending
    assert kept is not loss and kept.grad_fn is None
    assert kept.item() == loss.item()  # the value is kept: only the graph is let go
    opt.zero_grad(set_to_none=True)
    _step(model, opt)  # the loop goes on
    assert mon.errors == []


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((torch.ones(3, 4),), {}),
        ((torch.ones(3, 5, dtype=torch.int64),), {}),
        ((torch.ones(3, 5, 2, dtype=torch.int64),), {}),
        ((torch.ones(2, 7, dtype=torch.int32), torch.ones(2)), {}),
        ((torch.tensor(1.0),), {}),
        ((), {"input_ids": torch.ones(2, 6, dtype=torch.int64)}),
        ((torch.ones(3, 4),), {"input_ids": torch.ones(2, 6, dtype=torch.int64)}),
        (([torch.ones(5, 2)],), {}),
        (("text", torch.ones(4, 2)), {}),
        ((), {}),
    ],
)
def test_forward_counts_read_what_batch_size_and_token_count_read(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    assert forward_counts(args, kwargs) == (batch_size(args, kwargs), token_count(args, kwargs))


@pytest.mark.parametrize(
    ("call", "keeps"),
    [
        (lambda loss: loss.backward(), False),
        (lambda loss: loss.backward(retain_graph=True), True),
        (lambda loss: torch.autograd.backward(loss, None, True), True),
        (lambda loss: torch.autograd.backward(loss, retain_graph=True), True),
        (lambda loss: torch.autograd.backward(loss, None, None, True), True),
        (lambda loss: torch.autograd.backward(loss, create_graph=True), True),
        (lambda loss: torch.autograd.backward([loss], None, False, False, None, None), False),
    ],
    ids=[
        "tensor-method",
        "tensor-method-retain",
        "retain-positional",
        "retain-keyword",
        "create-positional",
        "create-keyword",
        "all-six-positional",
    ],
)
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
def test_the_backward_wrapper_passes_every_way_of_calling_on(call: Any, keeps: bool) -> None:
    # The wrapper forwards what it was given as it came (torch's parameters after the first
    # two, positional or by name) and reads retain_graph / create_graph from either form.
    model = torch.nn.Linear(3, 1)
    seen: list[bool] = []

    class Listener:
        def backward_called(self, tensors: object, grad: object, keeps_graph: bool) -> None:
            seen.append(keeps_graph)

        def backward_failed(self) -> None:
            pass

    listener = Listener()  # held weakly by intercept: kept here
    stop = intercept.listen(listener)  # type: ignore[arg-type]
    try:
        call(model(torch.ones(2, 3)).sum())
    finally:
        stop()
    assert model.weight.grad is not None
    assert seen == [keeps]


def test_the_backward_wrapper_passes_on_what_another_torch_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A torch whose backward() dropped grad_variables and added a keyword: the wrapper still
    # hands on exactly what the loop gave (it names no parameter after the first two).
    got: list[tuple[Any, ...]] = []

    def other_backward(
        tensors: Any,
        grad_tensors: Any = None,
        retain_graph: Any = None,
        create_graph: bool = False,
        inputs: Any = None,
        new_flag: bool = False,
    ) -> None:
        got.append((grad_tensors, retain_graph, create_graph, inputs, new_flag))

    monkeypatch.setattr(intercept, "_ORIGINAL_BACKWARD", other_backward)
    loss = torch.ones(1, requires_grad=True).sum()
    intercept.backward(loss, None, None, False, ["x"], new_flag=True)
    intercept.backward(loss, inputs=["y"])
    assert got == [(None, None, False, ["x"], True), (None, None, False, ["y"], False)]


def test_the_root_hooks_call_dynamo_only_under_torch_compile(tmp_path: Path) -> None:
    # torch.compiler.disable's wrapper switches dynamo's frame evaluation off and on (~1.5 us
    # a call): outside torch.compile the root hooks are plain calls. (Under it they run
    # untraced: tests/test_grad_norm_frameworks.py and test_throughput.py compile a model.)
    def dynamo_calls(monitored: bool) -> int:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon = (
            nbmonitor.attach(model, opt, run_dir=tmp_path / str(monitored), display=False)
            if monitored
            else None
        )
        calls = 0

        def profile(frame: Any, event: str, arg: object) -> None:
            nonlocal calls
            if event == "call" and frame.f_code.co_filename.endswith("eval_frame.py"):
                calls += 1

        _step(model, opt)
        sys.setprofile(profile)
        try:
            for _ in range(5):
                _step(model, opt)
        finally:
            sys.setprofile(None)
            if mon is not None:
                mon.close()
        return calls

    assert dynamo_calls(True) == dynamo_calls(False)


@pytest.mark.parametrize(
    "value",
    [
        torch.tensor(0.25),
        torch.tensor([1.5], dtype=torch.float64),
        torch.tensor(2.0, requires_grad=True) * 3,
        torch.tensor(float("nan")),
        torch.tensor(3, dtype=torch.int64),
        torch.tensor(True),
        torch.tensor(0.5, dtype=torch.bfloat16),
        torch.tensor(1 + 2j),
        torch.ones(3),
    ],
    ids=["f32", "f64-1", "grad", "nan", "int", "bool", "bf16", "complex", "several"],
)
def test_a_logged_cpu_loss_is_what_make_log_record_makes(
    watched: Watched, value: torch.Tensor
) -> None:
    # mon.log(loss=t) of a CPU tensor takes a short way: the same record, the same refusals.
    mon, model, opt, seen = watched
    _step(model, opt)
    try:
        want = make_log_record(1, {"loss": value})
    except TypeError as exc:
        with pytest.raises(TypeError, match=re.escape(str(exc))):
            mon.log(loss=value)
        return
    mon.log(loss=value)
    got = seen[-1]
    if isinstance(got, StepRecord):  # a float, folded into the step's record
        assert got.step == 1 and type(got.loss) is float
        assert want.numbers.keys() == {"loss"}
        assert got.loss == pytest.approx(want.numbers["loss"], nan_ok=True)
        assert value.dtype.is_floating_point
    else:
        assert isinstance(got, LogRecord)
        assert (got.step, got.source, got.tensors, got.dropped) == (1, LOGGED, [], ())
        assert got.numbers.keys() == want.numbers.keys() == {"loss"}
        assert type(got.numbers["loss"]) is float
        assert got.numbers["loss"] == pytest.approx(want.numbers["loss"], nan_ok=True)
    assert mon.internals.clock()._loss.logged_step == 1


def test_a_root_of_several_values_is_never_read_as_a_loss(watched: Watched) -> None:
    # A root alone is kept unchecked (started()); one that is no loss is dropped when read.
    mon, model, opt, _ = watched
    out = model(torch.ones(2, 4))
    with pytest.raises(RuntimeError, match="scalar outputs"):
        out.backward()  # two values and no gradient given: torch refuses
    loss = out.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    mon.flush()
    assert mon.history()["loss"].tolist() == [pytest.approx(loss.item())]
    assert mon.errors == []
