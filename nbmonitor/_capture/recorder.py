"""The hand-off from the training thread to the sampler thread: an append-only queue of records
(``nbmonitor.records``) and of blocks of ordinary steps written as columns (``StepBlock``), and
the packing of ``mon.log()`` values into one record.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping

import numpy as np
import torch

from nbmonitor._capture.device_value import DeviceValue, HostRing, to_device_value
from nbmonitor.records import (
    MEASURED_KEYS,
    MEASURED_PREFIX,
    AuxRecord,
    LogRecord,
    MemoryRecord,
    NormLayout,
    Pending,
    Record,
    SpanRecord,
    StepColumns,
    StepRecord,
    StructureRecord,
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


class StepBlock:
    """Consecutive ordinary steps written as columns by the training thread: a list per field
    of ``StepRecord``, made ahead (``[x] * capacity``, grown by doubling) so that a step is a
    store into each (no record, no call), the gradient values in consecutive rows of one
    ``HostRing`` (``first`` the first's sequence number), read by the sampler in slices
    (``take``). The steps are consecutive (``step`` the first); a column that does not vary in
    the usual loop is kept only where the block's first step had it (``tokens``, ``phases``,
    ``clip``/``max_norm``, ``heads``: None otherwise, and a step that differs starts another
    block), and the learning rates only where they change (``lr_rows``).

    ``w`` rows are written (the training thread's count); ``n`` of them published, readable by
    the sampler (the last row written is held while the loop may still log its loss:
    ``Recorder``). Once ``closed`` no row is added and ``n`` is final: whoever closes it sets
    ``n`` first. ``taken`` rows were drained (the sampler's)."""

    __slots__ = (
        "cap", "clip", "closed", "first", "heads", "index", "layout", "loss", "lr_rows", "lrs",
        "max_norm", "micro", "n", "phases", "ring", "samples", "step", "step_time", "taken",
        "time", "tokens", "w",
    )  # fmt: skip

    def __init__(
        self,
        step: int,
        ring: HostRing | None,
        index: tuple[int, ...] | None,
        layout: NormLayout | None,
        lrs: tuple[float, ...],
        *,
        tokens: bool,
        timed: bool,
        clipped: bool,
    ) -> None:
        self.step = step
        self.ring = ring
        self.first = ring.seq if ring is not None else 0
        self.index = index
        self.layout = layout
        cap = self.cap = FIRST_ROWS
        nan = math.nan
        self.time: list[float] = [nan] * cap
        self.step_time: list[float] = [nan] * cap
        self.samples: list[int] = [0] * cap
        self.micro: list[int] = [0] * cap
        self.loss: list[float | None] = [None] * cap
        self.tokens: list[int] | None = [0] * cap if tokens else None
        self.phases: list[tuple[float, ...] | None] | None = [None] * cap if timed else None
        self.clip: list[Pending | None] | None = [None] * cap if clipped else None
        self.max_norm: list[float] | None = [nan] * cap if clipped else None
        # The squared norms read as floats first (a layout with dot products), a list a row.
        squared = layout is not None and layout.squared
        self.heads: list[list[float] | None] | None = [None] * cap if squared else None
        # The learning rates from each row in lr_rows on (a tuple the clock hands again
        # while none changes).
        self.lrs = [lrs]
        self.lr_rows = [0]
        self.w = 0
        self.n = 0
        self.taken = 0
        self.closed = False

    def grow(self) -> None:
        """Twice the room (training thread; the sampler reads only rows published before)."""
        cap = self.cap
        nan = math.nan
        self.time += [nan] * cap
        self.step_time += [nan] * cap
        self.samples += [0] * cap
        self.micro += [0] * cap
        self.loss += [None] * cap
        if self.tokens is not None:
            self.tokens += [0] * cap
        if self.phases is not None:
            self.phases += [None] * cap
        if self.clip is not None and self.max_norm is not None:
            self.clip += [None] * cap
            self.max_norm += [nan] * cap
        if self.heads is not None:
            self.heads += [None] * cap
        self.cap = cap * 2

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def take(self, end: int) -> StepColumns:
        """Rows ``[taken, end)`` (published) as the sampler reads them; their ring rows are free
        once read (sampler thread)."""
        start = self.taken
        s = slice(start, end)
        count = end - start
        ring = self.ring
        head = tail = None
        if ring is not None:
            tail = ring.read(self.first + start, self.first + end)
            if self.heads is not None:
                head = np.array(self.heads[s], dtype=np.float64)
        self.taken = end
        nan = math.nan
        lrs: list[tuple[float, ...]] = []
        # lr_rows first: the training thread appends to lrs, then to lr_rows, so lrs is at
        # least as long (a change for a row not published yet is past ``end``: unused).
        rows = list(self.lr_rows)
        changes = list(self.lrs)[: len(rows)]
        for i, (value, row) in enumerate(zip(changes, rows, strict=True)):
            upto = rows[i + 1] if i + 1 < len(rows) else end
            lrs += [value] * (min(upto, end) - max(row, start))  # (none when negative)
        return StepColumns(
            list(range(self.step + start, self.step + end)),
            self.time[s],
            self.step_time[s],
            self.samples[s],
            [0] * count if self.tokens is None else self.tokens[s],
            self.micro[s],
            lrs,
            [None] * count if self.phases is None else self.phases[s],
            self.loss[s],
            [None] * count if self.clip is None else self.clip[s],
            [nan] * count if self.max_norm is None else self.max_norm[s],
            head,
            tail,
            self.index,
            self.layout,
        )


def _floats(values: tuple[object, ...], width: int) -> bool:
    """``width`` learning rates, each a float (read already)."""
    if len(values) != width:
        return False
    for value in values:  # noqa: SIM110 (a loop: no generator made)
        if type(value) is not float:
            return False
    return True


# Records that carry no value of a step's row: the sampler files them apart from the rows
# (layer samples sorted by step, spans, memory breakdowns, structural facts), so they can wait
# beside an open block (``Recorder._side``) instead of closing it.
_SIDE = frozenset((AuxRecord, SpanRecord, MemoryRecord, StructureRecord))

# The rows a StepBlock's columns are made with, and its most (doubling in between): its lists
# are dropped once it is read whole.
FIRST_ROWS = 64
BLOCK_ROWS = 4096


class Recorder:
    """Append-only queue: the training thread puts, the sampler drains records that are ready.

    ``collections.deque`` appends and pops are atomic under the GIL, so the training thread
    takes no lock.

    The newest step is **held** (``hold``, ``end_step``) rather than put: the loop's
    ``mon.log(loss=...)`` after ``optimizer.step()`` belongs to it and is folded into it
    (``fold_loss``), so that a step is one record. It is put when the next one is held (a
    step later: no call of its own a step), before any other record put (a value of its step
    that cannot be folded, the next step's own records), when the training thread hands it on
    (``release``: a flush, close), or by the sampler once it has stayed held through a whole
    drain (a loop that stopped, or a step longer than a tick). A step that put records of its
    own (a sampled step's) is not held: it goes with them. Whoever pops it from ``held`` (one
    atomic ``dict.pop``) owns it: the other side then finds nothing to fold into or to put.

    **Steps as columns** (``end_step``): once a step ends with the one before it still held
    (nothing put between: the usual loop), the steps are written as rows of a ``StepBlock``
    in the queue instead of records, as long as they stay ordinary (see ``_fits``); what is
    held is then the block's last row, published (``StepBlock.n``) when the next is held. A
    record put closes the block (the queue keeps the order made); the next steps are records
    again until two end in a row with nothing put between.

    **Records beside a block** (``_side``): a record that carries no value of a step's row
    (``_SIDE``: a sampled step's layer samples, memory breakdown and structural facts, a span)
    put while a block is open does not close it: it waits in a side queue with a mark, the
    block and its rows written then (or, once something is on the side, the main queue's last
    item after the usual put), and the sampler drains it after the main queue, once what came
    before it there is drained (``drain``). So a sampled step is a row of the block like any
    other, and a tick's steps come as one block.
    """

    def __init__(self) -> None:
        self._queue: collections.deque[Record | StepBlock] = collections.deque()
        # What is held (key 0), and the block steps are written into (below): read by the
        # norm probe on the training thread to choose where a step's norms go (public, as an
        # attribute read: a property would be a call a step); written here only.
        self.held: dict[int, StepRecord | StepBlock] = {}
        # What the last drain found held (and, for a block, its rows written then): still held
        # at the next, it is handed on there.
        self._seen: StepRecord | StepBlock | None = None
        self._seen_rows = 0
        # A record of a later step than the last one ended was put: that step's record goes
        # with it at once, in the order the records were made (a sampled step's own records);
        # only a step that put nothing of its own is held.
        self._mixed = False
        # The step of the last step record held or put (public: the step clock writes an
        # ordinary step's row itself, StepClock._end_step, and sets it there).
        self.ended = -1
        # The training thread's: the block steps are written into (None: records), and
        # whether what it put in held is there still as far as it knows.
        self.block: StepBlock | None = None
        self._holding = False
        # Records beside the main queue, each with what must be drained before it: a block
        # and its rows then, or an item of the main queue (None: nothing).
        self._side: collections.deque[tuple[Record, object, int]] = collections.deque()

    def __len__(self) -> int:
        blocks = sum(b.w - b.taken for b in list(self._queue) if type(b) is StepBlock)
        records = sum(type(b) is not StepBlock for b in list(self._queue))
        held = self.held.get(0)
        side = len(self._side)
        return records + blocks + side + (held is not None and type(held) is not StepBlock)

    def _take_held(self) -> StepRecord | StepBlock | None:
        """Take back what is held (training thread): a record is put, a block's last row
        published; None when nothing was, or the sampler took it (which closed that block)."""
        previous = self.held.pop(0, None)
        if previous is None:
            if self._holding:
                self.block = None  # the sampler handed it on: its block is closed
        elif type(previous) is StepBlock:
            previous.n = previous.w
        else:
            self._queue.append(previous)
        self._holding = False
        return previous

    def _close_block(self) -> None:
        block = self.block
        if block is not None:
            self.block = None
            block.n = block.w
            block.closed = True

    def put(self, record: Record) -> None:
        """Put ``record``, after the step held (which can get nothing more now); a record of
        ``_SIDE`` put while a block is open (or others wait beside) goes beside it."""
        side = record.__class__ in _SIDE
        if side:
            block = self.block
            if block is not None:
                self._side.append((record, block, block.w))
                return
            side = bool(self._side)  # after those waiting beside, in the order put
        # _take_held() and _close_block(), written out: a loop that logs more than its loss
        # puts a record a step.
        previous = self.held.pop(0, None)
        if previous is None:
            if self._holding:
                self.block = None  # the sampler handed it on: its block is closed
        elif previous.__class__ is StepBlock:
            previous.n = previous.w
        else:
            self._queue.append(previous)
        self._holding = False
        if self.block is not None:
            self._close_block()
        if side:
            queue = self._queue
            tail = queue[-1] if queue else None
            self._side.append((record, tail, tail.w if type(tail) is StepBlock else 0))
            return
        self._queue.append(record)
        if record.step > self.ended:
            self._mixed = True

    def hold(self, record: StepRecord) -> None:
        """Hold ``record`` (a step that just ended), putting the one held before it; a step
        that put records of its own is put at once, after them."""
        self._take_held()
        self._close_block()
        self.ended = record.step
        if self._mixed:
            self._mixed = False
            self._queue.append(record)
        else:
            self.held[0] = record
            self._holding = True

    def end_step(
        self,
        step: int,
        time: float,
        step_time: float,
        samples: int,
        micro_batches: int,
        lrs: tuple[float | Pending, ...],
        norms: Pending | HostRing | None,
        norm_index: tuple[int, ...] | None,
        norms_layout: NormLayout | None,
        clip_norm: Pending | None,
        max_norm: float,
        skipped: bool,
        groups_added: tuple[tuple[int, int, int], ...],
        tokens: int,
        phases: tuple[float, ...] | Pending | None,
    ) -> None:
        """A step ended with these values (``StepRecord``'s fields): a row of the block
        steps are written into when it is ordinary, else a record; held either way. (Types
        compared through ``__class__``: no call.)"""
        held = self.held
        previous = held.pop(0, None)
        block = self.block
        if previous is block and block is not None:
            # The usual step: the row before is this block's, still held (so nothing was put
            # since, which would have closed it). Published now; this one goes after it when
            # it is like it (the checks below, the same as after a record), held in its turn.
            w = block.n = block.w
            if (
                norms is block.ring  # the ring's next row, or no gradient values on either
                and (norms is not None or clip_norm is None)
                and not skipped
                and not groups_added
                and norm_index is block.index
                and norms_layout is block.layout
                and (block.tokens is None) is (not tokens)
                and (phases.__class__ is tuple if block.phases is not None else phases is None)
                and (block.clip is None) is (clip_norm is None)
                and (norms is None or norms.seq == block.first + w)
                and (lrs is block.lrs[-1] or _floats(lrs, len(block.lrs[-1])))
                and w < BLOCK_ROWS
            ):
                if w == block.cap:
                    block.grow()
                block.time[w] = time
                block.step_time[w] = step_time
                block.samples[w] = samples
                block.micro[w] = micro_batches
                if lrs is not block.lrs[-1]:
                    block.lrs.append(lrs)  # type: ignore[arg-type]
                    block.lr_rows.append(w)
                if block.tokens is not None:
                    block.tokens[w] = tokens
                if block.phases is not None:
                    block.phases[w] = phases  # type: ignore[assignment]
                if block.clip is not None and block.max_norm is not None:
                    block.clip[w] = clip_norm
                    block.max_norm[w] = max_norm
                if norms is not None:
                    if block.heads is not None:
                        block.heads[w] = norms.head
                    norms.seq += 1  # (HostRing.commit)
                block.w = w + 1
                self.ended = step
                held[0] = block  # (still ``_holding``)
                return
        # _take_held(), written out: one call less a step.
        elif previous is None:
            if self._holding:
                self.block = None  # the sampler handed it on: its block is closed
        elif previous.__class__ is StepBlock:
            previous.n = previous.w
        else:
            self._queue.append(previous)
        self._holding = False
        self.ended = step
        block = self.block
        ring = norms if norms.__class__ is HostRing else None
        if (
            not self._mixed
            and (block is not None or previous is not None)
            # Ordinary: gradient values in a host ring's next row or none, phases read
            # already, nothing else to tell.
            and (ring is not None or (norms is None and clip_norm is None))
            and not skipped
            and not groups_added
            and (phases is None or phases.__class__ is tuple)
        ):
            if block is not None and not (
                block.ring is ring
                and block.index is norm_index
                and block.layout is norms_layout
                and (block.tokens is None) is (not tokens)
                and (block.phases is None) is (phases is None)
                and (block.clip is None) is (clip_norm is None)
                and (ring is None or ring.seq == block.first + block.w)
                and (lrs is block.lrs[-1] or _floats(lrs, len(block.lrs[-1])))
                and block.w < BLOCK_ROWS
            ):
                self._close_block()
                block = None
            if block is None and _floats(lrs, len(lrs)):
                block = self.block = StepBlock(
                    step,
                    ring,
                    norm_index,
                    norms_layout,
                    lrs,  # type: ignore[arg-type]
                    tokens=bool(tokens),
                    timed=phases is not None,
                    clipped=clip_norm is not None,
                )
                self._queue.append(block)
            if block is not None:
                w = block.w
                if w == block.cap:
                    block.grow()
                block.time[w] = time
                block.step_time[w] = step_time
                block.samples[w] = samples
                block.micro[w] = micro_batches
                if lrs is not block.lrs[-1]:
                    block.lrs.append(lrs)  # type: ignore[arg-type]
                    block.lr_rows.append(w)
                if block.tokens is not None:
                    block.tokens[w] = tokens
                if block.phases is not None:
                    block.phases[w] = phases
                if block.clip is not None and block.max_norm is not None:
                    block.clip[w] = clip_norm
                    block.max_norm[w] = max_norm
                if ring is not None:
                    if block.heads is not None:
                        block.heads[w] = ring.head
                    ring.seq += 1  # the row written is the step's (HostRing.commit)
                block.w = w + 1
                self.held[0] = block
                self._holding = True
                return
        if block is not None:
            self._close_block()
        if ring is not None:
            norms = ring.value()
        record = StepRecord(
            step,
            time,
            step_time,
            samples,
            micro_batches,
            lrs,
            norms,  # type: ignore[arg-type]
            norm_index,
            norms_layout,
            clip_norm,
            max_norm,
            skipped,
            groups_added,
            tokens,
            phases,
        )
        if self._mixed:
            self._mixed = False
            self._queue.append(record)
        else:
            self.held[0] = record
            self._holding = True

    def release(self) -> None:
        """Put the step held, if any (its step can get no more values from the loop)."""
        self._take_held()

    def held_step(self) -> int:
        """The step of the record held (-1: none)."""
        held = self.held.get(0)
        if held is None:
            return -1
        return held.step + held.w - 1 if type(held) is StepBlock else held.step

    def fold_loss(self, step: int, loss: float | Pending) -> bool:
        """Fold ``loss`` (logged alone for ``step``) into that step's held record; False when
        it is not held or already has one (the caller then puts a LogRecord)."""
        held = self.held
        record = held.pop(0, None)
        if record is None:
            if self._holding:  # the sampler handed it on
                self.block = None
                self._holding = False
            return False
        if type(record) is StepBlock:
            last = record.w - 1
            if (
                record.step + last != step
                or record.loss[last] is not None
                or type(loss) is not float
            ):
                held[0] = record
                return False
            record.loss[last] = loss
        else:
            if record.step != step or record.loss is not None:
                held[0] = record
                return False
            record.loss = loss
        held[0] = record
        return True

    def drain(self, wait: bool = False) -> list[Record]:
        """Records whose device values have landed, in order; stops at the first that has not
        (and after a block still open: what the training thread puts next comes after it). A
        block's published rows come as one ``StepColumns`` a drain. Then the records beside
        (``_side``), in the order put, up to the first whose mark is not drained yet or that
        has not landed.

        With ``wait=True`` (used by close()) it waits for every record instead, the held one
        included.
        """
        held = self.held.get(0)
        if held is not None:
            rows = held.w if type(held) is StepBlock else 0
            if wait or (held is self._seen and rows == self._seen_rows):
                taken = self.held.pop(0, None)  # None: the training thread took it meanwhile
                if type(taken) is StepBlock:
                    taken.n = taken.w
                    taken.closed = True
                elif taken is not None:
                    self._queue.append(taken)
                held = None
            self._seen_rows = rows
        self._seen = held
        out: list[Record] = []
        queue = self._queue
        while queue:
            head = queue[0]
            if type(head) is StepBlock:
                closed = head.closed  # before n: n is final once it is
                end = head.n
                if end > head.taken:
                    out.append(head.take(end))
                if not closed:
                    break
                queue.popleft()
                continue
            if not head.ready():
                if not wait:
                    break
                head.wait()
            out.append(queue.popleft())  # type: ignore[arg-type]
        side = self._side
        while side:
            record, mark, rows = side[0]
            if mark is not None:
                if type(mark) is StepBlock:
                    if mark.taken < rows:  # rows put before it not drained yet
                        break
                # A copy (one C call under the GIL): iterating the deque itself while the
                # training thread appends to it raises RuntimeError, and the records already
                # taken out would be lost with it.
                elif any(item is mark for item in list(queue)):
                    break
            if not record.ready():
                if not wait:
                    break
                record.wait()
            out.append(record)
            side.popleft()
        return out
