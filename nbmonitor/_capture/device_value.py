"""DeviceValue: a value on its way from the device to the host, without a synchronisation.

The training thread appends small records and returns; it never waits on the device. A value that
lives on an accelerator is copied to pinned host memory with a non-blocking copy and an event is
recorded behind it; the sampler takes a record only once its event has completed, so reading it
never blocks. On the CPU a logged value is read when it is recorded (nothing to wait for, and a
tensor changed in place later keeps what was logged); tensors nbmonitor makes itself are kept
as they are and read by the sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from nbmonitor.records import PackedRow, Pending


class DeviceValue:
    """A tensor of one or more scalars on its way to the host, readable once ``ready()``."""

    __slots__ = ("_array", "_event", "_head", "_host", "_owned", "_scalar")

    def __init__(
        self,
        tensor: torch.Tensor | None,
        head: list[float] | None = None,
        tail: torch.Tensor | None = None,
    ) -> None:
        self._array: npt.NDArray[np.float64] | None = None
        self._scalar: float | None = None
        self._event: Any = None
        self._host: torch.Tensor | None = None
        self._owned: torch.Tensor | None = None
        self._head: list[float] | None = None
        if tensor is None:  # packed(): see there
            self._owned = None if tail is None else tail.detach() if tail.requires_grad else tail
            self._head = head if head is not None else []
            return
        if tensor.is_cpu:
            # On the CPU a value is a memory read with nothing to wait for, so it is read now:
            # a single value (a loss, an lr) as a float, which keeps what was logged even if
            # the tensor is changed in place later; several values (always a tensor nbmonitor
            # has just computed) as a numpy view. The sampler then makes no torch call for
            # them (each one hands the GIL back and forth), and the training thread makes as
            # few calls as possible: right after optimizer.step() each costs ~10 us here.
            if tensor.numel() == 1:
                # item() reads it in one call (no detached tensor made, no grad warning).
                self._scalar = float(tensor.item())
            else:
                t = tensor.detach() if tensor.requires_grad else tensor
                if t.dtype not in (torch.float32, torch.float64):
                    t = t.to(torch.float64)
                # A copy of its own, not a view: a view keeps the tensor alive, one more
                # object the garbage collector tracks (and promotes) until the sampler's tick,
                # at every step (numpy arrays are not tracked).
                self._array = t.numpy().copy()
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
        return cls(None, head, tail)

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

    def stack_alike(
        self, values: Sequence[Pending]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.floating[Any]] | None] | None:
        """Several ``packed()`` values of one shape (this one first) as two arrays, one row
        per value: their heads (float64) and their tensors (their own dtype; None without),
        in one numpy and one torch call; None unless every value was packed alike."""
        if self._head is None:
            return None
        no_tail = self._owned is None
        tails: list[torch.Tensor] = []
        heads: list[list[float]] = []
        for v in values:
            if not isinstance(v, DeviceValue):
                return None
            head, owned = v.packed_parts()
            if head is None or (owned is None) != no_tail:
                return None
            heads.append(head)
            if owned is not None:
                tails.append(owned)
        # One torch call for all of them, not a numpy() per value.
        return np.array(heads, dtype=np.float64), (torch.stack(tails).numpy() if tails else None)

    def packed_parts(self) -> tuple[list[float] | None, torch.Tensor | None]:
        """What ``packed()`` was given: the head (None if it was not packed) and the tail."""
        return self._head, self._owned

    def _joined(self) -> npt.NDArray[np.float64]:
        head = np.array(self._head, dtype=np.float64)
        if self._owned is None:
            return head
        return np.concatenate((head, self._owned.numpy()), dtype=np.float64)


def to_device_value(values: list[torch.Tensor]) -> DeviceValue:
    """Pack scalar tensors (same device) into one tensor so that they cross in one copy."""
    if len(values) == 1:
        return DeviceValue(values[0].detach().reshape(1))
    return DeviceValue(torch.stack([v.detach().reshape(()).to(torch.float32) for v in values]))


# A PinnedRing's most rows, and its most bytes of pinned memory (a model of many tensors gets
# fewer rows: its steps are slower).
RING_ROWS = 1024
RING_BYTES = 8 << 20


class FromValues:
    """The part of ``Pending`` a value read as one small list answers the same way: its
    floats and array made from ``values()``, and no stacking with others alike."""

    __slots__ = ()

    def values(self) -> list[float]:
        raise NotImplementedError

    def floats(self) -> npt.NDArray[np.floating[Any]]:
        return self.array()

    def array(self) -> npt.NDArray[np.float64]:
        return np.array(self.values(), dtype=np.float64)

    def stack_alike(
        self, values: Sequence[Pending]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.floating[Any]] | None] | None:
        return None


class PinnedRing:
    """Rows of pinned host memory a step's device values are copied into, each with a CUDA
    event of its own, made once and used again: a step's crossing costs one non-blocking copy
    and one event record, with no host tensor, event or pinned block made for it.

    ``copy`` takes the first free row (one the sampler has read, ``RingValue.values``); with
    none free (a sampler far behind) it says so (None) and the caller copies the usual way.
    ``new_event`` and ``pin`` let a test run the same path on the CPU.
    """

    def __init__(
        self,
        width: int,
        dtype: torch.dtype,
        rows: int = 0,
        *,
        new_event: Any = None,
        pin: bool = True,
    ) -> None:
        self.width = width
        self.dtype = dtype
        # Enough rows for the steps of a few ticks of a fast loop, within RING_BYTES.
        size = torch.empty((), dtype=dtype).element_size()
        rows = rows or max(16, min(RING_ROWS, RING_BYTES // max(1, width * size)))
        self._host = torch.empty((rows, width), dtype=dtype, pin_memory=pin)
        # The row views, made once (a slice made per step would be a torch call more).
        self._rows = list(self._host.unbind(0))
        self._events: list[Any] = [None] * rows
        # The sampler sets a row free (False) once it has read it; this thread sets it busy.
        self._busy = [False] * rows
        self._next = 0
        self._new_event = new_event or _plain_event

    def copy(self, tensor: torch.Tensor, norms: int) -> RingValue | None:
        """``tensor`` (1-D, this ring's dtype, at most ``width`` values) on its way into the
        next free row: ``norms`` gradient norms, then the values crossing with them."""
        row = self._next
        if self._busy[row] or tensor.dtype != self.dtype or len(tensor) != self.width:
            return None
        self._rows[row].copy_(tensor, non_blocking=True)
        event = self._events[row]
        if event is None:
            event = self._events[row] = self._new_event()
        event.record()
        self._busy[row] = True
        self._next = row + 1 if row + 1 < len(self._busy) else 0
        return RingValue(self, row, norms)

    def event(self, row: int) -> Any:
        """The event recorded behind row ``row``'s copy."""
        return self._events[row]

    def read(self, row: int) -> list[float]:
        """Row ``row``'s values (its copy has landed), the row then free again."""
        values: list[float] = self._rows[row].tolist()
        self._busy[row] = False
        return values


# The head of a row without squared norms first: one array for all (never written to).
_NO_HEAD = np.empty(0, dtype=np.float64)
_NO_HEAD.flags.writeable = False


class HostRing:
    """Rows of host memory a CPU step's gradient values are written straight into
    (``torch.stack(norms, out=row)``, ``torch.cat(parts, out=row)``): no tensor, array or
    value made for them a step. The step's row is ``row()``, the next one; the step clock's
    recorder takes it for the step's columns (``commit``) or, for a step that goes as a record
    of its own, copies it (``value``), and a later step writes the same row again.

    One writer (the training thread: ``row``, ``commit``, ``head``) and one reader (the
    sampler: ``read``, which frees the rows it read), rows used in order: ``seq`` rows were
    committed, ``freed`` read. With none free (a sampler far behind) ``row()`` is None and
    the caller packs the step's values the usual way. ``head`` holds the step's squared norms
    read already as floats (``NormLayout.squared`` of them; empty without), which go with
    the row's values."""

    def __init__(self, width: int, dtype: torch.dtype, rows: int = 0) -> None:
        self.width = width
        self.dtype = dtype
        size = torch.empty((), dtype=dtype).element_size()
        rows = rows or max(16, min(RING_ROWS * 4, RING_BYTES // max(1, width * size)))
        self.host: npt.NDArray[np.floating[Any]] = torch.empty((rows, width), dtype=dtype).numpy()
        # The row views, made once (a slice made per step would be a torch call more).
        self.rows = list(torch.from_numpy(self.host).unbind(0))
        self.size = rows
        self.seq = 0
        self.freed = 0
        self.head: list[float] = []

    def row(self) -> torch.Tensor | None:
        """The next row to write (that of the step in progress), None when none is free."""
        seq = self.seq
        if seq - self.freed >= self.size:
            return None
        return self.rows[seq % self.size]

    def commit(self) -> int:
        """The row written is the step's: its sequence number (rows are read in order)."""
        seq = self.seq
        self.seq = seq + 1
        return seq

    def value(self) -> PackedRow:
        """The row written, copied, as the value of a step recorded on its own (no torch
        call: numpy's copy)."""
        row = self.host[self.seq % self.size]
        head = self.head
        return PackedRow(np.array(head, dtype=np.float64) if head else _NO_HEAD, row.copy())

    def read(self, start: int, end: int) -> npt.NDArray[np.floating[Any]]:
        """Rows ``[start, end)`` (sequence numbers, committed) as a matrix of their own; the
        rows up to ``end`` are then free (sampler thread)."""
        rows = self.size
        a, b = start % rows, end % rows
        if end - start == 0:
            out = self.host[:0].copy()
        elif a < b:
            out = self.host[a:b].copy()
        else:  # wrapped around the end
            out = np.concatenate((self.host[a:], self.host[:b]))
        self.freed = end
        return out


class RingValue(FromValues):
    """The gradient norms of one step in a ``PinnedRing`` row, and the values that crossed
    with them (the step's loss: ``element``); a ``records.Pending`` of the norms."""

    __slots__ = ("_norms", "_ring", "_row", "_values")

    def __init__(self, ring: PinnedRing, row: int, norms: int) -> None:
        self._ring = ring
        self._row = row
        self._norms = norms
        self._values: list[float] | None = None

    def ready(self) -> bool:
        return self._values is not None or bool(self._ring.event(self._row).query())

    def wait(self) -> None:
        if self._values is None:
            self._ring.event(self._row).synchronize()

    def _all(self) -> list[float]:
        values = self._values
        if values is None:  # read once, and the row is free for the training thread again
            values = self._values = self._ring.read(self._row)
        return values

    def values(self) -> list[float]:
        return self._all()[: self._norms]

    def element(self, at: int) -> float:
        """Value ``at`` of the row (past the norms: what crossed with them)."""
        return self._all()[at]


class RingElement(FromValues):
    """One value that crossed with a step's norms (``RingValue.element``): the loss logged
    for the step when it is the tensor its backward started from."""

    __slots__ = ("_at", "_value")

    def __init__(self, value: RingValue, at: int) -> None:
        self._value = value
        self._at = at

    def ready(self) -> bool:
        return self._value.ready()

    def wait(self) -> None:
        self._value.wait()

    def values(self) -> list[float]:
        return [self._value.element(self._at)]


def _plain_event() -> Any:
    return torch.cuda.Event()  # type: ignore[no-untyped-call]
