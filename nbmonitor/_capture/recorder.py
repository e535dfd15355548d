"""The hand-off from the training thread to the sampler thread: an append-only queue of records
(``nbmonitor.records``), and the packing of ``mon.log()`` values into one.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping

import torch

from nbmonitor._capture.device_value import DeviceValue, to_device_value
from nbmonitor.records import (
    MEASURED_KEYS,
    MEASURED_PREFIX,
    LogRecord,
    Pending,
    Record,
    StepRecord,
)


def make_log_record(step: int, scalars: Mapping[str, object]) -> LogRecord:
    """Validate ``mon.log()`` arguments and pack them.

    A key nbmonitor measures itself (``step``, ``lr``, ``grad_norm``, ... see
    ``records.MEASURED_KEYS``) is refused, and so is a value of the wrong kind (a string, a
    tensor or array of several values, a complex tensor): TypeError at the call, the caller's
    bug. A value of the right kind that cannot be read (a tensor on the meta device, an int
    too large for a float, an object whose ``__float__`` raises) is refused too
    (``LogValueError``, a ValueError). Every check is on the type and shape: no device sync.
    """
    record = LogRecord(step)
    keys: list[str] = []
    tensors: list[torch.Tensor] = []
    for key, value in scalars.items():
        if not key or len(key) > MAX_LOG_KEY:
            raise LogValueError(_bad_name(key))
        if key in MEASURED_KEYS or key.startswith(MEASURED_PREFIX):  # inline: ~0.1 us a key
            # TypeError, as Python raises for a keyword a function does not take.
            raise TypeError(
                f"nbmonitor: log({key}=...) would overwrite the column nbmonitor measures as "
                f"{key!r}; log your value under another name, e.g. my_{key}=..."
            )
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
            if value.is_meta:
                raise LogValueError(
                    f"nbmonitor: log({key}=...) got a tensor on the meta device, which has no "
                    "value; pass the tensor the computation made on a real device."
                )
            keys.append(key)
            tensors.append(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            shape = getattr(value, "shape", None)  # a numpy array (or array-like) of values
            if isinstance(shape, tuple) and math.prod(shape) != 1:
                raise TypeError(
                    f"nbmonitor: log({key}=...) got an array of shape {shape}; pass one number "
                    "(e.g. its mean) or log each value under its own name."
                )
            if hasattr(value, "__float__") and not isinstance(value, (bool, str, bytes)):
                # numpy scalars and the like: a float is what the user meant.
                _add_number(record, key, value)
                continue
            raise TypeError(
                f"nbmonitor: log({key}=...) needs a number or a tensor, got "
                f"{type(value).__name__}; pass e.g. loss=loss or acc=0.93."
            )
        elif isinstance(value, float):
            record.numbers[key] = value
        else:
            _add_number(record, key, value)
    if len(tensors) == 1:
        record.tensors.append(((keys[0],), DeviceValue(tensors[0])))
    elif tensors:
        try:
            record.tensors.append((tuple(keys), to_device_value(tensors)))
        except RuntimeError:  # tensors on different devices cross one by one
            pairs = zip(keys, tensors, strict=True)
            record.tensors.extend(((k,), DeviceValue(t)) for k, t in pairs)
    return record


class LogValueError(ValueError):
    """A ``mon.log`` value of the right kind that cannot be read as a number, or a name that
    cannot be a column."""


# The longest name mon.log takes: a column, a chart's legend, a key in every exporter
# (MLflow's limit, 250, less its "train/" prefix, with room to spare).
MAX_LOG_KEY = 200


def _bad_name(key: str) -> str:
    if not key:
        return "nbmonitor: log() got a value with an empty name; name each value, e.g. acc=0.93."
    return (
        f"nbmonitor: log() got a name of {len(key)} characters ({key[:40]!r}...); a name is at "
        f"most {MAX_LOG_KEY} characters: name the value, not its description."
    )


def _add_number(record: LogRecord, key: str, value: object) -> None:
    try:
        record.numbers[key] = float(value)  # type: ignore[arg-type]
    except OverflowError:
        raise LogValueError(
            f"nbmonitor: log({key}=...) got an int too large for a float (beyond 1.8e308); "
            "pass a float or a scaled value."
        ) from None
    except Exception as exc:
        raise LogValueError(
            f"nbmonitor: log({key}=...) got a {type(value).__name__} that cannot be read as a "
            f"number ({type(exc).__name__}: {exc}); pass a number or a 1-element tensor."
        ) from None


class Recorder:
    """Append-only queue: the training thread puts, the sampler drains records that are ready.

    ``collections.deque`` appends and pops are atomic under the GIL, so the training thread
    takes no lock.

    The newest step's record is **held** (``hold``) rather than put: the loop's
    ``mon.log(loss=...)`` after ``optimizer.step()`` belongs to it and is folded into it
    (``fold_loss``), so that a step is one record. It is put when the next one is held (a
    step later: no call of its own a step), before any other record put (a value of its step
    that cannot be folded, the next step's own records), when the training thread hands it on
    (``release``: a flush, close), or by the sampler once it has stayed held through a whole
    drain (a loop that stopped, or a step longer than a tick). A step that put records of its
    own (a sampled step's) is not held: it goes with them. Whoever pops it from ``_held`` (one
    atomic ``dict.pop``) owns it: the other side then finds nothing to fold into or to put.
    """

    def __init__(self) -> None:
        self._queue: collections.deque[Record] = collections.deque()
        self._held: dict[int, StepRecord] = {}
        # What the last drain found held: still held at the next, it is handed on there.
        self._seen: StepRecord | None = None
        # A record of a later step than the last one ended was put: that step's record goes
        # with it at once, in the order the records were made (a sampled step's own records);
        # only a step that put nothing of its own is held.
        self._mixed = False
        self._ended = -1  # the step of the last step record held or put

    def __len__(self) -> int:
        return len(self._queue) + len(self._held)

    def put(self, record: Record) -> None:
        """Put ``record``, after the step record held (which can get nothing more now)."""
        held = self._held.pop(0, None)
        if held is not None:
            self._queue.append(held)
        self._queue.append(record)
        if record.step > self._ended:
            self._mixed = True

    def hold(self, record: StepRecord) -> None:
        """Hold ``record`` (a step that just ended), putting the one held before it; a step
        that put records of its own is put at once, after them."""
        held = self._held
        previous = held.pop(0, None)
        if previous is not None:
            self._queue.append(previous)
        self._ended = record.step
        if self._mixed:
            self._mixed = False
            self._queue.append(record)
        else:
            held[0] = record

    def release(self) -> None:
        """Put the record held, if any (its step can get no more values from the loop)."""
        record = self._held.pop(0, None)
        if record is not None:
            self._queue.append(record)

    def held_step(self) -> int:
        """The step of the record held (-1: none)."""
        record = self._held.get(0)
        return -1 if record is None else record.step

    def fold_loss(self, step: int, loss: float | Pending) -> bool:
        """Fold ``loss`` (logged alone for ``step``) into that step's held record; False when
        it is not held or already has one (the caller then puts a LogRecord)."""
        held = self._held
        record = held.pop(0, None)
        if record is None:
            return False
        if record.step != step or record.loss is not None:
            held[0] = record
            return False
        record.loss = loss
        held[0] = record
        return True

    def drain(self, wait: bool = False) -> list[Record]:
        """Records whose device values have landed, in order; stops at the first that has not.

        With ``wait=True`` (used by close()) it waits for every record instead, the held one
        included.
        """
        held = self._held.get(0)
        if held is not None and (wait or held is self._seen):
            taken = self._held.pop(0, None)  # None: the training thread took it meanwhile
            if taken is not None:
                self._queue.append(taken)
            held = None
        self._seen = held
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
