"""The records that cross from the training thread to the sampler thread, one type per kind.

The training thread (``_capture/``) makes them; the sampler (``_engine/``) reads them. Values
still on their way from a device are ``Pending``: the capture side implements it with torch
(``_capture/device_value.py``), so that this module, and everything on the sampler side that
reads records, imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from nbmonitor.memory import MemoryBreakdown

FloatArray = npt.NDArray[np.float64]


class Pending(Protocol):
    """One or more scalars on their way to the host, readable once ``ready()``."""

    def ready(self) -> bool: ...

    def wait(self) -> None:
        """Block until the values have landed; only for close() and flush(), never in a hook."""

    def values(self) -> list[float]: ...

    def floats(self) -> npt.NDArray[np.floating[Any]]:
        """The values as a 1-D float32/float64 array, not to be written to."""

    def array(self) -> FloatArray:
        """The values as a float64 array of the caller's own."""

    def stack_alike(
        self, values: Sequence[Pending]
    ) -> tuple[FloatArray, npt.NDArray[np.floating[Any]] | None] | None:
        """``values`` (this one first) packed alike as a head matrix and a tail matrix, one row
        per value, or None when they were not packed alike."""


@dataclass(frozen=True, slots=True)
class NormLayout:
    """How a step's packed gradient values unpack: ``squared`` squared norms, then ``norms``
    norms, then the raw values of the concatenated tensors, tensor ``i``'s starting at
    ``starts[i]``."""

    squared: int
    norms: int
    starts: tuple[int, ...]
    offsets: npt.NDArray[np.intp] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", np.asarray(self.starts, dtype=np.intp))


def squared_norms(values: npt.NDArray[np.floating[Any]], layout: NormLayout | None) -> FloatArray:
    """The squared per-tensor norms in packed ``values`` (plain norms when ``layout`` is None),
    as a new float64 array; ``values`` may hold one step per row. A NaN or Inf anywhere in a
    tensor's values carries into its entry."""
    if layout is None:
        # A huge norm squares to Inf, which is what it means here: no warning for it.
        with np.errstate(over="ignore", invalid="ignore"):
            plain: FloatArray = np.square(values, dtype=np.float64)
        return plain
    return squared_norms_split(values[..., : layout.squared], values[..., layout.squared :], layout)


def squared_norms_split(
    head: npt.NDArray[np.floating[Any]],
    tail: npt.NDArray[np.floating[Any]] | None,
    layout: NormLayout,
) -> FloatArray:
    """``squared_norms`` of values held in two parts: ``head``, the squared norms, and
    ``tail``, what follows them (None: nothing), so that the raw values are not copied once
    more only to be joined to a few squared norms."""
    parts = [head.astype(np.float64)]
    if tail is not None:
        # Squares that overflow are Inf (a non-finite gradient, reported as such): no
        # RuntimeWarning in the user's output.
        with np.errstate(over="ignore", invalid="ignore"):
            parts += _tail_squares(tail, layout)
    return np.concatenate(parts, axis=-1)


# The raw values ``_tail_squares`` squares at once (128 KiB of float64): the squares of a
# tick's steps made whole are megabytes, each pass over them out of the caches and in freshly
# mapped memory (a page fault every 4 KiB), which costs more than the numpy calls of pieces.
SQUARE_CHUNK = 16384


def _tail_squares(tail: npt.NDArray[np.floating[Any]], layout: NormLayout) -> list[FloatArray]:
    parts: list[FloatArray] = []
    cut = layout.norms
    if cut:
        parts.append(np.square(tail[..., :cut], dtype=np.float64))
    if layout.starts:
        # Squares in the values' own precision, sums in float64: biases have thousands of
        # values.
        values = tail[..., cut:]
        offsets = layout.offsets
        if values.dtype != np.float32:
            parts.append(np.add.reduceat(np.square(values), offsets, axis=-1, dtype=np.float64))
        elif values.ndim != 2 or values.size <= SQUARE_CHUNK:
            parts.append(
                np.add.reduceat(_float32_squares(values), offsets, axis=-1, dtype=np.float64)
            )
        else:
            sums = np.empty((len(values), len(offsets)))
            rows = max(1, SQUARE_CHUNK // values.shape[-1])
            for at in range(0, len(values), rows):
                squares = _float32_squares(values[at : at + rows])
                np.add.reduceat(
                    squares, offsets, axis=-1, dtype=np.float64, out=sums[at : at + rows]
                )
            parts.append(sums)
    return parts


def _float32_squares(values: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float32]:
    """``np.square(values)`` of float32 ``values``, made in float64 and rounded once: a float32
    square below float32's normal range (a deep layer's gradients of 1e-20) is a subnormal,
    which the CPU computes far slower; the float64 square of a float32 is exact, so
    rounding it gives what float32 arithmetic would, bit for bit."""
    wide = values.astype(np.float64)
    np.multiply(wide, wide, out=wide)
    return wide.astype(np.float32)


@dataclass(slots=True)
class StepRecord:
    """One optimizer step (or one backward pass when there is no optimizer)."""

    step: int
    time: float  # wall clock, seconds since the epoch
    step_time: float  # seconds since the previous step ended
    samples: int  # batch items seen by grad-enabled forwards during this step
    micro_batches: int
    lrs: tuple[float | Pending, ...]
    # Per-parameter gradient norms on their way to the host, or None without gradients.
    norms: Pending | None = None
    # Which tracked parameter each norm belongs to; None means all of them, in order.
    norm_index: tuple[int, ...] | None = None
    # How the values unpack into squared norms (the CPU path); None: they are norms.
    norms_layout: NormLayout | None = None
    # What clip_grad_norm_ returned (the norm before clipping), when it was called once.
    clip_norm: Pending | None = None
    max_norm: float = math.nan
    # The GradScaler skipped the optimizer step (inf/NaN gradients); no norms then.
    skipped: bool = False
    # Param groups added to the optimizer since the previous step: (index, parameters in it,
    # of which not in the attached model).
    groups_added: tuple[tuple[int, int, int], ...] = ()
    # Token ids the grad-enabled forwards of this step were given (``input_ids``); 0: none.
    tokens: int = 0
    # How long each of ``PHASES`` took, in seconds: read already (the host clock), or on its
    # way from the device (CUDA events, on the steps timed there); None: phases off.
    phases: tuple[float, ...] | Pending | None = None
    # ``mon.log(loss=...)`` for this step, when the loop logged it alone once the step had
    # ended (most loops): folded in here instead of a LogRecord of its own (source LOGGED).
    loss: float | Pending | None = None

    def ready(self) -> bool:
        if self.norms is not None and not self.norms.ready():
            return False
        if self.clip_norm is not None and not self.clip_norm.ready():
            return False
        phases = self.phases
        if phases is not None and not isinstance(phases, tuple) and not phases.ready():
            return False
        loss = self.loss
        if loss is not None and not isinstance(loss, float) and not loss.ready():
            return False
        # A loop, not all() over a generator (~0.4 us more each): the sampler asks this of
        # every step's records.
        for lr in self.lrs:  # noqa: SIM110
            if not isinstance(lr, float) and not lr.ready():
                return False
        return True

    def wait(self) -> None:
        if self.norms is not None:
            self.norms.wait()
        if self.clip_norm is not None:
            self.clip_norm.wait()
        for lr in self.lrs:
            if not isinstance(lr, float):
                lr.wait()
        if self.phases is not None and not isinstance(self.phases, tuple):
            self.phases.wait()
        if self.loss is not None and not isinstance(self.loss, float):
            self.loss.wait()

    def phase_values(self) -> list[float] | None:
        """The phases' seconds in ``PHASES`` order (None: not timed); raises if they cannot
        be read."""
        phases = self.phases
        if phases is None:
            return None
        return list(phases) if isinstance(phases, tuple) else phases.values()

    def loss_value(self) -> float | None:
        """The loss folded in (``loss``) as a float, None without one; raises if it cannot be
        read."""
        loss = self.loss
        if loss is None or isinstance(loss, float):
            return loss
        return loss.values()[0]


class PackedRow:
    """One step's gradient values as a ``Pending``: ``head`` (float64, the squared norms a
    ``NormLayout`` puts first; empty without) then ``tail`` (the rest, in their own dtype).
    A step read out of ``StepColumns`` on its own (``StepColumns.record``) carries its norms so,
    read the same way as the packed value it would have had."""

    __slots__ = ("head", "tail")

    def __init__(self, head: FloatArray, tail: npt.NDArray[np.floating[Any]]) -> None:
        self.head = head
        self.tail = tail

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def values(self) -> list[float]:
        return self.array().tolist()  # type: ignore[no-any-return]

    def floats(self) -> npt.NDArray[np.floating[Any]]:
        return self.tail if not len(self.head) else self.array()

    def array(self) -> FloatArray:
        return np.concatenate((self.head, self.tail), dtype=np.float64)

    def stack_alike(
        self, values: Sequence[Pending]
    ) -> tuple[FloatArray, npt.NDArray[np.floating[Any]] | None] | None:
        if not all(isinstance(v, PackedRow) for v in values):
            return None
        rows: list[PackedRow] = values  # type: ignore[assignment]
        return np.stack([r.head for r in rows]), np.stack([r.tail for r in rows])


@dataclass(slots=True)
class StepColumns:
    """Consecutive steps written as columns by the training thread (``_capture/recorder.py``,
    the common path: one row of each column a step, no record a step), as the sampler drained
    them: one list (or one matrix) per field of ``StepRecord``, a row per step, in step order.

    Every step in it is an ordinary one: not skipped, no param group added, its learning rates
    and phases read already (floats), its loss (when the loop logged it alone after
    ``step()``) a float or None, its gradient values (``norm_tail``, and ``norm_head`` for
    the squared norms a layout puts first) on the host already. ``record(i)`` is row ``i`` as
    the ``StepRecord`` it replaces."""

    steps: list[int]
    time: list[float]
    step_time: list[float]
    samples: list[int]
    tokens: list[int]
    micro_batches: list[int]
    lrs: list[tuple[float, ...]]
    phases: list[tuple[float, ...] | None]
    loss: list[float | None]
    clip_norm: list[Pending | None]
    max_norm: list[float]
    norm_head: FloatArray | None
    norm_tail: npt.NDArray[np.floating[Any]] | None
    norm_index: tuple[int, ...] | None
    norms_layout: NormLayout | None

    @property
    def step(self) -> int:
        """The first step (what the sampler orders records by)."""
        return self.steps[0]

    def __len__(self) -> int:
        return len(self.steps)

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def record(self, i: int) -> StepRecord:
        """Row ``i`` as the ``StepRecord`` it replaces (for a step the sampler reads on its own:
        one that other records of the tick touch)."""
        tail = self.norm_tail
        norms: Pending | None = None
        if tail is not None:
            head = self.norm_head
            norms = PackedRow(head[i] if head is not None else _NO_HEAD, tail[i])
        return StepRecord(
            self.steps[i],
            self.time[i],
            self.step_time[i],
            self.samples[i],
            self.micro_batches[i],
            self.lrs[i],
            norms,
            self.norm_index,
            self.norms_layout,
            self.clip_norm[i],
            self.max_norm[i],
            tokens=self.tokens[i],
            phases=self.phases[i],
            loss=self.loss[i],
        )

    def cut(self, start: int, end: int) -> StepColumns:
        """Rows ``[start, end)``."""
        s = slice(start, end)
        head, tail = self.norm_head, self.norm_tail
        return StepColumns(
            self.steps[s],
            self.time[s],
            self.step_time[s],
            self.samples[s],
            self.tokens[s],
            self.micro_batches[s],
            self.lrs[s],
            self.phases[s],
            self.loss[s],
            self.clip_norm[s],
            self.max_norm[s],
            None if head is None else head[s],
            None if tail is None else tail[s],
            self.norm_index,
            self.norms_layout,
        )


_NO_HEAD: FloatArray = np.empty(0, dtype=np.float64)


# The columns of a step's row that nbmonitor measures (assemble/steps.py writes them), and
# "lr_group<i>" for each param group after the first: a value logged under one of these names
# would silently replace the measurement, so mon.log() refuses them.
MEASURED_KEYS = frozenset(
    {
        "step",
        "time",
        "step_time",
        "micro_batches",
        "samples",
        "samples_per_s",
        "tokens",
        "tokens_per_s",
        "flops_per_step",
        "tflops_per_s",
        "mfu_percent",
        "lr",
        "grad_norm",
        "loss_smooth",
    }
)
MEASURED_PREFIX = "lr_group"

# The phases of a step, in the order they happen: the wait for data (from the previous step's
# end, or a micro-batch's backward, to the next forward), forward, backward, other (between
# the backward and the optimizer: clipping, unscaling, nbmonitor's own norms) and the optimizer
# step. Their sum is the step's time; each is a column ``phase_<name>_s`` of the step's row.
PHASES = ("data", "forward", "backward", "other", "optimizer")
PHASE_KEYS = tuple(f"phase_{name}_s" for name in PHASES)
MEASURED_KEYS = MEASURED_KEYS | frozenset(PHASE_KEYS)


# LogRecord.source, in order of precedence.
LOGGED = 0
FROM_BACKWARD = 1
FROM_OUTPUT = 2


@dataclass(slots=True)
class LogRecord:
    """Values from ``mon.log()`` or read from a model output, for one step."""

    step: int
    numbers: dict[str, float] = field(default_factory=dict)
    tensors: list[tuple[tuple[str, ...], Pending]] = field(default_factory=list)
    # Keys whose value could not be read, with why; the sampler reports them (a tuple, so that
    # the usual record allocates nothing for it).
    dropped: tuple[tuple[str, Exception], ...] = ()
    # Where the values come from: LOGGED (``mon.log``), FROM_BACKWARD (the tensors the step's
    # backward passes started from) or FROM_OUTPUT (the model output's ``.loss``). A step's key
    # takes the values of the first source that gives it, in that order (one loss per step).
    source: int = 0

    def ready(self) -> bool:
        for _, value in self.tensors:  # noqa: SIM110 (as StepRecord.ready)
            if not value.ready():
                return False
        return True

    def wait(self) -> None:
        for _, value in self.tensors:
            value.wait()

    def resolve(self) -> tuple[dict[str, float], list[tuple[str, Exception]]]:
        """The values by key, and the keys whose value could not be read (with why): one
        value that fails costs only its own keys."""
        out = dict(self.numbers)
        failed = list(self.dropped)
        for keys, value in self.tensors:
            try:
                out.update(zip(keys, value.values(), strict=True))
            except Exception as exc:
                failed.extend((key, exc) for key in keys)
        return out, failed


@dataclass(slots=True)
class AuxRecord:
    """Optional per-layer measurements of one step, packed in one value.

    ``kind`` is "update" (parameter norms then update norms, one per tracked parameter),
    "forward" (per module: non-finite flag, input mean, std, max |x|) or "activations" (per leaf
    module: mean, std, max |x|, fraction of exact zeros) or "stopped" (``on_nan="raise"``
    stopped the loop: ``names`` are the first non-finite parameters, or the module whose output
    was, and the value is 0 or 1 to say which); ``names`` label the rows.
    """

    step: int
    kind: str
    names: tuple[str, ...]
    value: Pending

    def ready(self) -> bool:
        return self.value.ready()

    def wait(self) -> None:
        self.value.wait()


@dataclass(slots=True)
class SpanRecord:
    """One ``mon.span(name)`` that ended: when it started (wall clock, seconds since the
    epoch), how long it took (seconds, host clock), how deep it was nested, on which thread,
    and the step in progress when it started (completed steps + 1)."""

    name: str
    step: int
    start: float
    duration: float
    depth: int = 0
    thread: int = 0

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class FlopsRecord:
    """The FLOPs of one grad-enabled forward, counted once (``probes/flops.py``), and what it
    was given: training FLOPs per step follow from it by the tokens (or samples) of each step.

    ``dtype`` is the compute precision of the matrix products: ``"bfloat16"``, ``"float16"``
    (autocast or half parameters), ``"tfloat32"`` (float32 with TF32 matmuls) or
    ``"float32"``; it picks the peak that MFU is taken against.
    """

    step: int
    forward_flops: float
    tokens: int
    samples: int
    dtype: str

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None


# How an optimizer applies its update: one fused kernel, one foreach call per group of tensors,
# a Python loop over the tensors, or not known (a class without torch's fused/foreach options).
OPTIMIZER_IMPLEMENTATIONS = ("fused", "foreach", "for-loop", "unknown")


@dataclass(frozen=True, slots=True)
class OptimizerRecord:
    """What the monitor's optimizer is, read once when it becomes the monitor's (at attach, or
    when adopted): its class, which implementation its step runs (``OPTIMIZER_IMPLEMENTATIONS``)
    and which faster ones it offers for its parameters' device. The time rules suggest only
    what the run does not already use."""

    step: int
    name: str  # the class, e.g. "Adam"
    device: str  # of its parameters, e.g. "cpu", "cuda"
    implementation: str
    can_fuse: bool  # a fused=True implementation exists for this class and device
    can_foreach: bool  # a foreach=True implementation exists for this class

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """What holds memory at a sampled step (``probes/memory.py``): parameters, buffers,
    gradients and optimizer state, and the activations saved for backward on that step, as
    ``nbmonitor.memory`` breakdown (plain data, read from tensor metadata)."""

    breakdown: MemoryBreakdown

    @property
    def step(self) -> int:
        return self.breakdown.step

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None


# A structural fact's value: plain data only (it crosses threads and is written to disk).
Fact = bool | int | float | str | None | tuple["Fact", ...]


@dataclass(frozen=True, slots=True)
class StructureRecord:
    """What the training side read of the run's structure, without a sync (``_capture/
    structure.py``): once at attach (``kind`` "model", "optimizer") or on a sampled step
    ("forward": the modes of the modules whose train/eval differs, dropout rates, autocast;
    "batchnorm": the batch a BatchNorm layer sees; "backward": the loss's autograd graph and
    whether the gradients were reset since the last step; "pre_step": whether they were
    reset between the backward and the step). ``facts`` are (key, value) pairs; ``value``
    holds device numbers read later (``value_keys`` name them: the first layer's input
    scale)."""

    step: int
    kind: str
    facts: tuple[tuple[str, Fact], ...]
    value: Pending | None = None
    value_keys: tuple[str, ...] = ()

    def ready(self) -> bool:
        return self.value is None or self.value.ready()

    def wait(self) -> None:
        if self.value is not None:
            self.value.wait()

    def resolve(self) -> dict[str, Fact]:
        """The facts as a dict, the device numbers read (NaN for one that cannot be)."""
        out: dict[str, Fact] = dict(self.facts)
        if self.value is not None:
            try:
                values = self.value.values()
            except Exception:
                values = [math.nan] * len(self.value_keys)
            out.update(zip(self.value_keys, values, strict=False))
        return out


Record = (
    StepRecord
    | StepColumns
    | LogRecord
    | AuxRecord
    | FlopsRecord
    | SpanRecord
    | MemoryRecord
    | OptimizerRecord
    | StructureRecord
)
