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

from nbmonitor.records import Pending


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
