"""The hand-off: records are taken in order, and only once their device values have landed."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import torch

from nbmonitor._capture.device_value import DeviceValue, to_device_value
from nbmonitor._capture.recorder import Recorder, make_log_record
from nbmonitor.records import LogRecord, StepRecord


class PendingValue(DeviceValue):
    """Stands in for a CUDA copy whose event has not completed yet."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(torch.tensor(values))
        self.landed = False
        self.waited = False

    def ready(self) -> bool:
        return self.landed

    def wait(self) -> None:
        self.waited = True
        self.landed = True


def step(n: int, norms: DeviceValue | None = None) -> StepRecord:
    return StepRecord(n, 0.0, 0.1, 4, 1, (0.1,), norms)


def test_drain_stops_at_the_first_record_not_ready_and_keeps_order() -> None:
    rec = Recorder()
    pending = PendingValue([3.0, 4.0])
    rec.put(step(1))
    rec.put(step(2, pending))
    rec.put(make_log_record(2, {"loss": 1.0}))
    first = rec.drain()
    assert [r.step for r in first] == [1]
    assert len(rec) == 2
    assert rec.drain() == []  # still not landed: nothing is skipped over
    pending.landed = True
    rest = rec.drain()
    assert [type(r) for r in rest] == [StepRecord, LogRecord]
    assert pending.values() == [3.0, 4.0]


def test_drain_with_wait_takes_everything() -> None:
    rec = Recorder()
    pending = PendingValue([1.0])
    rec.put(step(1, pending))
    out = rec.drain(wait=True)
    assert len(out) == 1 and pending.waited and len(rec) == 0


def test_a_held_step_takes_its_loss_and_is_put_when_the_next_is_held() -> None:
    rec = Recorder()
    rec.hold(step(1))
    assert rec.fold_loss(1, 0.5)
    assert not rec.fold_loss(1, 0.25)  # one loss folded: the next is a LogRecord of its own
    assert not rec.fold_loss(2, 0.25)  # not the step held
    assert rec.held_step() == 1 and len(rec) == 1
    rec.hold(step(2))  # the next step ends: the one before is put
    first = rec.drain()
    assert [(type(r), r.step) for r in first] == [(StepRecord, 1)]
    assert first[0].loss == 0.5  # type: ignore[union-attr]
    assert rec.held_step() == 2


def test_a_step_held_through_a_whole_drain_is_handed_on_by_the_sampler() -> None:
    # A loop that stopped (or a step longer than a tick): the sampler takes the held record at
    # its second drain, so that the last step shows without a flush.
    rec = Recorder()
    rec.hold(step(1))
    assert rec.drain() == []
    assert [r.step for r in rec.drain()] == [1]
    assert rec.held_step() == -1 and not rec.fold_loss(1, 0.5)  # a late loss: a LogRecord
    rec.hold(step(2))
    assert rec.drain(wait=True)[0].step == 2  # close: everything, the held one too


def test_release_puts_the_held_step_before_what_follows() -> None:
    rec = Recorder()
    rec.hold(step(1))
    rec.release()
    rec.put(make_log_record(1, {"acc": 1.0}))
    rec.release()  # nothing held: nothing happens
    assert [type(r) for r in rec.drain()] == [StepRecord, LogRecord]


def test_log_record_reads_cpu_tensors_at_once() -> None:
    x = torch.tensor([2.0], requires_grad=True)
    record = make_log_record(3, {"a": torch.tensor(1.0), "b": x * 1, "c": 5, "d": torch.tensor(7)})
    assert record.tensors == []  # nothing left for the sampler to read, no tensor kept
    assert record.resolve() == ({"a": 1.0, "b": 2.0, "c": 5.0, "d": 7.0}, [])


def test_device_tensors_are_packed_into_one_value() -> None:
    value = to_device_value([torch.tensor(1.0), torch.tensor([2.0]), torch.tensor(3)])
    assert value.values() == [1.0, 2.0, 3.0]  # one copy for all of them


def test_cpu_value_keeps_neither_the_tensor_nor_its_graph() -> None:
    # A logged loss must not hold its autograd graph (and the activations it saved) until the
    # sampler runs: the graph lives as long as the loss tensor object does.
    x = torch.ones(3, requires_grad=True)
    loss = (x * 2).sum()
    norms = torch.stack([loss.detach(), loss.detach() * 2])
    ref = weakref.ref(loss)
    one, many = DeviceValue(loss), DeviceValue(norms)
    del loss
    gc.collect()
    assert ref() is None
    assert one.values() == [6.0] and many.values() == [6.0, 12.0]


def test_packed_value_is_its_floats_then_its_tensor() -> None:
    tail = torch.tensor([3.0, 4.0], requires_grad=True) * 1  # made by nbmonitor, with a graph
    value = DeviceValue.packed([1.0, 2.0], tail)
    assert value.ready()
    assert value.values() == [1.0, 2.0, 3.0, 4.0]
    assert value.floats().tolist() == [1.0, 2.0, 3.0, 4.0]
    array = value.array()
    assert array.dtype == np.float64 and array.tolist() == [1.0, 2.0, 3.0, 4.0]
    array[0] = 9.0  # the caller's own copy
    assert value.values()[0] == 1.0
    assert value._owned is not None and not value._owned.requires_grad
    alone = DeviceValue.packed([5.0], None)
    assert alone.values() == [5.0] and alone.floats().tolist() == [5.0]


def test_stack_alike_rows_are_each_values_parts() -> None:
    def tail(*v: float) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.float32)

    alike = [DeviceValue.packed([1.0, 2.0], tail(3, 4)), DeviceValue.packed([5.0, 6.0], tail(7, 8))]
    split = alike[0].stack_alike(alike)
    assert split is not None and split[1] is not None
    assert split[0].dtype == np.float64 and split[0].tolist() == [[1.0, 2.0], [5.0, 6.0]]
    assert split[1].tolist() == [[3.0, 4.0], [7.0, 8.0]]
    heads_only = DeviceValue.packed([1.0], None).stack_alike(
        [DeviceValue.packed([1.0], None), DeviceValue.packed([2.0], None)]
    )
    assert heads_only is not None and heads_only[1] is None
    assert heads_only[0].tolist() == [[1.0], [2.0]]
    unalike = [DeviceValue.packed([1.0], tail(2)), DeviceValue.packed([3.0, 4.0], None)]
    assert unalike[0].stack_alike(unalike) is None
    assert (
        DeviceValue(torch.tensor([1.0, 2.0])).stack_alike([DeviceValue(torch.tensor([1.0, 2.0]))])
        is None
    )


class _Event:
    def record(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


def test_a_pinned_ring_row_is_used_again_once_read_and_a_full_ring_says_so() -> None:
    from nbmonitor._capture.device_value import PinnedRing, RingElement

    ring = PinnedRing(3, torch.float32, rows=2, pin=False, new_event=_Event)
    a = ring.copy(torch.tensor([3.0, 4.0, 0.5]), norms=2)
    b = ring.copy(torch.tensor([1.0, 2.0, 0.25]), norms=2)
    assert a is not None and b is not None
    assert ring.copy(torch.tensor([9.0, 9.0, 9.0]), norms=2) is None  # full: the caller copies
    assert ring.copy(torch.tensor([1.0, 2.0]), norms=2) is None  # not a row's width
    loss = RingElement(a, 2)
    assert a.ready() and a.values() == [3.0, 4.0] and loss.values() == [0.5]
    c = ring.copy(torch.tensor([5.0, 6.0, 0.125]), norms=2)  # a's row, free again
    assert c is not None and c.values() == [5.0, 6.0]
    assert a.values() == [3.0, 4.0] and loss.values() == [0.5]  # read once, kept
    assert b.array().tolist() == [1.0, 2.0]


def test_a_step_that_put_records_of_its_own_is_put_with_them_not_held() -> None:
    from nbmonitor.records import AuxRecord

    rec = Recorder()
    rec.hold(step(1))
    rec.put(make_log_record(1, {"acc": 1.0}))  # step 1's: after its record, which is put
    rec.put(AuxRecord(2, "update", ("w",), DeviceValue(torch.tensor([1.0]))))  # step 2's own
    rec.hold(step(2))  # goes right after its own records, in the order made
    assert rec.held_step() == -1 and not rec.fold_loss(2, 0.5)
    rec.hold(step(3))  # a step that put nothing else is held
    assert rec.held_step() == 3
    kinds = [(type(r).__name__, r.step) for r in rec.drain()]
    assert kinds == [("StepRecord", 1), ("LogRecord", 1), ("AuxRecord", 2), ("StepRecord", 2)]
