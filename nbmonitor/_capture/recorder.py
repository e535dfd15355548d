"""The hand-off from the training thread to the sampler thread: an append-only queue of records
(``nbmonitor.records``), and the packing of ``mon.log()`` values into one.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

import torch

from nbmonitor._capture.device_value import DeviceValue, to_device_value
from nbmonitor.records import LogRecord, Record


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
