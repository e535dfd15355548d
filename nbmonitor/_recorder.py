"""The hand-off from the training thread to the sampler thread.

The training thread appends small records and returns; it never waits on the device. A value that
lives on an accelerator is copied to pinned host memory with a non-blocking copy and an event is
recorded behind it; the sampler takes a record only once its event has completed, so reading it
never blocks. On the CPU a logged value is read when it is recorded (nothing to wait for, and a
tensor changed in place later keeps what was logged); tensors nbmonitor makes itself are kept
as they are and read by the sampler.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

if TYPE_CHECKING:
    from nbmonitor._gradnorms import NormLayout


class DeviceValue:
    """A tensor of one or more scalars on its way to the host, readable once ``ready()``."""

    __slots__ = ("_array", "_event", "_head", "_host", "_owned", "_scalar")

    def __init__(self, tensor: torch.Tensor) -> None:
        self._array: npt.NDArray[np.float64] | None = None
        self._scalar: float | None = None
        self._event: Any = None
        self._host: torch.Tensor | None = None
        self._owned: torch.Tensor | None = None
        self._head: list[float] | None = None
        if tensor.is_cpu:
            # On the CPU a value is a memory read with nothing to wait for, so it is read now:
            # a single value (a loss, an lr) as a float, which keeps what was logged even if
            # the tensor is changed in place later; several values (always a tensor nbmonitor
            # has just computed) as a numpy view. The sampler then makes no torch call for
            # them (each one hands the GIL back and forth), and the training thread makes as
            # few calls as possible: right after optimizer.step() each costs ~10 us here.
            if tensor.numel() == 1:
                self._scalar = float(tensor.detach())
            else:
                t = tensor.detach()
                if t.dtype not in (torch.float32, torch.float64):
                    t = t.to(torch.float64)
                self._array = t.numpy()
            return  # nothing else kept: not the tensor, nor the autograd graph behind it
        t = tensor.detach()
        if t.is_cuda:
            # A non-blocking device-to-host copy lands in pinned memory; the event tells the sampler
            # when it has arrived without a synchronize() on the training thread.
            self._host = t.to("cpu", non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            self._event = event
        else:
            # MPS has no event to poll and a non-blocking copy may be read before it lands, so
            # the tensor stays on the device and the sampler thread copies it (and waits).
            self._host = t

    @classmethod
    def packed(cls, head: list[float], tail: torch.Tensor | None) -> DeviceValue:
        """Values read already (``head``), then those of ``tail``, a 1-D float32/float64 CPU
        tensor nbmonitor has just made and nothing else holds: it is kept as it is and read on
        the sampler thread, which spares the training thread a call (~20 us there right after
        backward, for ``Tensor.numpy()``)."""
        value = cls.__new__(cls)
        value._array = value._scalar = value._event = value._host = None
        value._owned = None if tail is None else tail.detach() if tail.requires_grad else tail
        value._head = head
        return value

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def wait(self) -> None:
        """Block until the copy has landed; only for close(), never on the training thread."""
        if self._event is not None:
            self._event.synchronize()

    def _flat(self) -> torch.Tensor:
        # reshape() costs microseconds even when it changes nothing: packed values are 1-D.
        host = self._host
        assert host is not None  # only values not read at once (CUDA, MPS) get here
        flat = host if host.dim() == 1 else host.reshape(-1)
        if flat.is_mps:
            flat = flat.cpu()
        if flat.dtype not in (torch.float32, torch.float64):
            flat = flat.to(torch.float64)
        return flat

    def values(self) -> list[float]:
        if self._head is not None:
            tail: list[float] = [] if self._owned is None else self._owned.tolist()
            return self._head + tail
        if self._scalar is not None:
            return [self._scalar]
        if self._array is not None:
            values: list[float] = self._array.reshape(-1).tolist()
            return values
        return [float(v) for v in self._flat().tolist()]

    def floats(self) -> npt.NDArray[np.floating[Any]]:
        """The values as a 1-D float32 or float64 array, not to be written to; without a copy
        where there is one already (a tick stacks many of these, which is the copy)."""
        if self._head is not None:
            if not self._head and self._owned is not None:
                return self._owned.numpy()
            return self._joined()
        if self._array is not None:
            return self._array.reshape(-1)
        return self.array()

    def array(self) -> npt.NDArray[np.float64]:
        """The values as a float64 array of the caller's own (cheaper than ``values()``)."""
        if self._head is not None:
            return self._joined()
        if self._scalar is not None:
            return np.array([self._scalar])
        if self._array is not None:
            return self._array.reshape(-1).astype(np.float64)
        return self._flat().numpy().astype(np.float64)

    def _joined(self) -> npt.NDArray[np.float64]:
        head = np.array(self._head, dtype=np.float64)
        if self._owned is None:
            return head
        return np.concatenate((head, self._owned.numpy()), dtype=np.float64)


def stack_packed(
    values: list[DeviceValue],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.floating[Any]] | None] | None:
    """Several ``packed()`` values of one shape as two arrays, one row per value: their heads
    (float64) and their tensors (their own dtype; None without), in one numpy and one torch
    call; None unless every value was packed alike."""
    first = values[0]
    if first._head is None:
        return None
    no_tail = first._owned is None
    tails: list[torch.Tensor] = []
    for v in values:
        if v._head is None or (v._owned is None) != no_tail:
            return None
        if v._owned is not None:
            tails.append(v._owned)
    heads = np.array([v._head for v in values], dtype=np.float64)
    # One torch call for all of them, not a numpy() per value.
    return heads, (torch.stack(tails).numpy() if tails else None)


def to_device_value(values: list[torch.Tensor]) -> DeviceValue:
    """Pack scalar tensors (same device) into one tensor so that they cross in one copy."""
    if len(values) == 1:
        return DeviceValue(values[0].detach().reshape(1))
    return DeviceValue(torch.stack([v.detach().reshape(()).to(torch.float32) for v in values]))


@dataclass(slots=True)
class StepRecord:
    """One optimizer step (or one backward pass when there is no optimizer)."""

    step: int
    time: float  # wall clock, seconds since the epoch
    step_time: float  # seconds since the previous step ended
    samples: int  # batch items seen by grad-enabled forwards during this step
    micro_batches: int
    lrs: tuple[float | DeviceValue, ...]
    # Per-parameter gradient norms on their way to the host, or None without gradients.
    norms: DeviceValue | None = None
    # Which tracked parameter each norm belongs to; None means all of them, in order.
    norm_index: tuple[int, ...] | None = None
    # How the values unpack into squared norms (the CPU path); None: they are norms.
    norms_layout: NormLayout | None = None

    def ready(self) -> bool:
        if self.norms is not None and not self.norms.ready():
            return False
        return all(not isinstance(lr, DeviceValue) or lr.ready() for lr in self.lrs)

    def wait(self) -> None:
        if self.norms is not None:
            self.norms.wait()
        for lr in self.lrs:
            if isinstance(lr, DeviceValue):
                lr.wait()


@dataclass(slots=True)
class LogRecord:
    """Values from ``mon.log()`` or read from a model output, for one step."""

    step: int
    numbers: dict[str, float] = field(default_factory=dict)
    tensors: list[tuple[tuple[str, ...], DeviceValue]] = field(default_factory=list)

    def ready(self) -> bool:
        return all(value.ready() for _, value in self.tensors)

    def wait(self) -> None:
        for _, value in self.tensors:
            value.wait()

    def resolve(self) -> dict[str, float]:
        out = dict(self.numbers)
        for keys, value in self.tensors:
            out.update(zip(keys, value.values(), strict=True))
        return out


@dataclass(slots=True)
class AuxRecord:
    """Optional per-layer measurements of one step, packed in one device value.

    ``kind`` is "update" (parameter norms then update norms, one per tracked parameter),
    "forward" (per module: non-finite flag, input mean, std, max |x|) or "activations" (per leaf
    module: mean, std, max |x|, fraction of exact zeros); ``names`` label the rows.
    """

    step: int
    kind: str
    names: tuple[str, ...]
    value: DeviceValue

    def ready(self) -> bool:
        return self.value.ready()

    def wait(self) -> None:
        self.value.wait()


Record = StepRecord | LogRecord | AuxRecord


def make_log_record(step: int, scalars: Mapping[str, object]) -> LogRecord:
    """Validate ``mon.log()`` arguments and pack them; raises TypeError for a non-numeric value."""
    record = LogRecord(step)
    keys: list[str] = []
    tensors: list[torch.Tensor] = []
    for key, value in scalars.items():
        if isinstance(value, torch.Tensor):
            if value.is_cpu:
                # Read at once (see DeviceValue), in one call: item() neither warns about a
                # tensor that requires grad nor makes a detached one. A tensor of several
                # values fails here and a complex one is refused below, with their messages.
                try:
                    number = value.item()
                except RuntimeError:
                    pass
                else:
                    if not isinstance(number, complex):
                        record.numbers[key] = float(number)
                        continue
            if value.numel() != 1:
                raise TypeError(
                    f"nbmonitor: log({key}=...) got a tensor of shape {tuple(value.shape)}; "
                    "pass a 0-d or 1-element tensor (e.g. loss, not the per-sample losses)."
                )
            if value.is_complex():
                raise TypeError(f"nbmonitor: log({key}=...) got a complex tensor; pass a real one.")
            keys.append(key)
            tensors.append(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            if hasattr(value, "__float__") and not isinstance(value, (bool, str, bytes)):
                # numpy scalars and the like: a float is what the user meant.
                record.numbers[key] = float(value)
                continue
            raise TypeError(
                f"nbmonitor: log({key}=...) needs a number or a tensor, got "
                f"{type(value).__name__}; pass e.g. loss=loss or acc=0.93."
            )
        else:
            record.numbers[key] = float(value)
    if len(tensors) == 1:
        record.tensors.append(((keys[0],), DeviceValue(tensors[0])))
    elif tensors:
        try:
            record.tensors.append((tuple(keys), to_device_value(tensors)))
        except RuntimeError:  # tensors on different devices cross one by one
            pairs = zip(keys, tensors, strict=True)
            record.tensors.extend(((k,), DeviceValue(t)) for k, t in pairs)
    return record


class Recorder:
    """Append-only queue: the training thread puts, the sampler drains records that are ready.

    ``collections.deque`` appends and pops are atomic under the GIL, so the training thread
    takes no lock.
    """

    def __init__(self) -> None:
        self._queue: collections.deque[Record] = collections.deque()

    def put(self, record: Record) -> None:
        self._queue.append(record)

    def __len__(self) -> int:
        return len(self._queue)

    def drain(self, wait: bool = False) -> list[Record]:
        """Records whose device values have landed, in order; stops at the first that has not.

        With ``wait=True`` (used by close()) it waits for every record instead.
        """
        out: list[Record] = []
        queue = self._queue
        while queue:
            head = queue[0]
            if not head.ready():
                if not wait:
                    break
                head.wait()
            out.append(queue.popleft())
        return out
