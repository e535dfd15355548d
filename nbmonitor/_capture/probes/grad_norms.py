"""Per-tensor gradient norms for one step, taken on the training thread with the fewest calls.

On an accelerator this is one fused ``_foreach_norm``; the values cross to the host later without a
synchronisation (``DeviceValue``). On the CPU this pass over every gradient is most of what
nbmonitor costs (benchmarks/NOTES.md, "What the overhead is made of"), and right after
``backward()`` every torch call costs microseconds of its own, so the parameters are sorted once, at
attach, by what reads them in the fewest calls:

- large float tensors: a BLAS dot product each (about twice as fast as torch's norm kernel),
  read at once as a float (cheaper than the tensor ``stack`` would make of each), and then the
  other float tensors too, but for
- small 1-D float32 tensors (biases, norm weights): all copied in one ``torch.cat``; the sampler
  thread sums their squares;
- anything else (half precision): one ``_foreach_norm`` for all of them.

The results leave as one value (on the CPU: the dot products' floats, then one tensor for the
rest), and ``NormLayout`` says how to unpack them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch
from torch import _foreach_norm

from nbmonitor._capture.device_value import DeviceValue, HostRing, PinnedRing, RingValue
from nbmonitor._capture.probes.base import ProbeBase, StepContext
from nbmonitor._names import name_list
from nbmonitor.errors import Guard, NonFiniteError
from nbmonitor.records import AuxRecord, NormLayout, squared_norms

FloatArray = npt.NDArray[np.float64]

# Below this many values a dot product costs more in calls than it saves in reading. Its squared
# result overflows float32 only for a norm above ~1.8e19, which then reads as Inf.
DOT_MIN_NUMEL = 16_384
# The value of a "stopped" record (on_nan="raise"): 0 for a gradient, 1 for a module's output.
STOP_MARK = DeviceValue.packed([0.0], None)
STOP_MARK_FORWARD = DeviceValue.packed([1.0], None)
# The head of a packed value without dot products: one list for every step (never written to;
# a new empty one would be one more object kept, and tracked by the collector, per step).
NO_HEAD: list[float] = []
# The cat, and the stack it then needs, cost about what _foreach_norm spends on four tensors.
CONCAT_MIN_TENSORS = 4


def norm_dtype(params: Sequence[torch.Tensor]) -> torch.dtype:
    """The dtype norms are taken in: float32 (half-precision gradients accumulate in it too),
    float64 when any parameter is float64 (torch refuses to narrow it)."""
    return torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32


def grad_norms(grads: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> DeviceValue:
    """Per-tensor L2 norms of ``grads`` in ``dtype``, on the device, packed as one value.

    The total norm is not computed here: the sampler derives it on the host from these, which
    keeps two kernels and their Python overhead off the training thread.
    """
    try:
        # The common case, one dense device, in two calls; anything else takes the slow path.
        return DeviceValue(torch.stack(_foreach_norm(grads, 2, dtype=dtype)))
    except (RuntimeError, NotImplementedError):
        dense = [g.coalesce().values() if g.is_sparse else g for g in grads]
        norms = _foreach_norm(dense, 2, dtype=dtype)
        device = norms[0].device
        return DeviceValue(torch.stack([n.to(device, non_blocking=True) for n in norms]))


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """The CPU parameters sorted by how their gradients are read (indices into the parameters)."""

    dots: tuple[int, ...]
    rest: tuple[int, ...]
    concat: tuple[int, ...]
    layout: NormLayout
    dtype: torch.dtype  # of the _foreach_norm results
    # The parameter each unpacked norm belongs to; one tuple for every step, made once here.
    order: tuple[int, ...] = field(init=False, compare=False)

    # How many values follow the squared norms: the rest's norms, then the concatenated ones.
    tail_width: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", self.dots + self.rest + self.concat)


def cpu_plan(params: list[torch.nn.Parameter]) -> CpuPlan | None:
    """How to read these parameters' gradients on the CPU; None off the CPU."""
    if not params or any(p.device.type != "cpu" for p in params):
        return None
    dots: list[int] = []
    rest: list[int] = []
    concat: list[int] = []
    starts: list[int] = []
    offset = 0
    for i, p in enumerate(params):
        n = p.numel()
        if _dot_readable(p) and n >= DOT_MIN_NUMEL:
            dots.append(i)
        elif p.dtype == torch.float32 and p.dim() == 1 and n > 0:
            concat.append(i)
            starts.append(offset)
            offset += n
        else:
            rest.append(i)
    if len(concat) < CONCAT_MIN_TENSORS:
        rest = sorted(rest + concat)
        concat, starts = [], []
    if dots:
        # Once the dot-product path runs, a few more small tensors on it cost less than a
        # _foreach_norm call of their own: a code path not yet run this step is the slow part.
        wide = [i for i in rest if _dot_readable(params[i])]
        dots = sorted(dots + wide)
        rest = [i for i in rest if i not in set(wide)]
    if not dots and not concat:
        return None  # the general path is already a single call
    layout = NormLayout(len(dots), len(rest), tuple(starts))
    dtype = norm_dtype([params[i] for i in rest])
    width = len(rest) + (offset if concat else 0)
    return CpuPlan(tuple(dots), tuple(rest), tuple(concat), layout, dtype, width)


def _dot_readable(p: torch.nn.Parameter) -> bool:
    return p.dtype in (torch.float32, torch.float64) and p.numel() > 0


class NormPass:
    """Takes the per-tensor gradient norms of ``params`` (those that have a gradient).

    On CUDA (``deferred``) a step's norms are one ``_foreach_norm``, left on the device as its
    list of results: the step clock crosses them at the step's end, with the loss its backward
    started from, in one ``stack`` and one copy into a ``PinnedRing`` row (``cross``). On the
    CPU they are written straight into the next row of a ``HostRing`` (``host``), which the
    step's columns take (``Recorder.end_step``); with no row free, packed the usual way."""

    def __init__(self, params: list[torch.nn.Parameter], defer: bool = True) -> None:
        self.params = params
        self._defer = defer  # off: on_nan="raise" reads the norms at once
        self._planned_for: tuple[torch.dtype, torch.device] | None = None
        self.ring: PinnedRing | None = None
        self._nan: torch.Tensor | None = None
        self._replan()

    def _replan(self) -> None:
        params = self.params
        self.plan = cpu_plan(params)
        self.dtype = norm_dtype(params)
        self._flat: Callable[[torch.Tensor, int], torch.Tensor] = torch.Tensor.view
        self._planned_for = (params[0].dtype, params[0].device) if params else None
        devices = {p.device for p in params}
        self.deferred = self._defer and len(devices) == 1 and next(iter(devices)).type == "cuda"
        self.ring, self._nan = None, None
        # On the CPU, with every parameter's gradient: a row of this ring a step.
        self.host: HostRing | None = None
        if self._defer and devices == {torch.device("cpu")}:
            plan = self.plan
            if plan is None:
                self.host = HostRing(len(params), self.dtype) if params else None
            elif plan.tail_width:
                # torch.cat's dtype: the rest's norms', or the concatenated float32 values'.
                self.host = HostRing(plan.tail_width, plan.dtype if plan.rest else torch.float32)

    def cross(
        self, norms: tuple[torch.Tensor, ...], extra: torch.Tensor | None
    ) -> tuple[DeviceValue | RingValue, bool]:
        """``norms`` (a deferred step's ``_foreach_norm`` results) on their way to the host,
        with ``extra`` (a scalar on their device, or None) after them when it can cross in the
        same copy; and whether it did (then it is ``RingValue.element(len(norms))``)."""
        ring = self.ring
        if ring is None or ring.width != len(norms) + 1:
            ring = self.ring = PinnedRing(len(norms) + 1, self.dtype)
            self._nan = torch.full((), float("nan"), dtype=self.dtype, device=norms[0].device)
        pad = extra if extra is not None else self._nan
        assert pad is not None
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # noqa: SLF001  (the loss's graph is not ours)
        try:
            stacked = torch.stack([*norms, pad])
        finally:
            torch._C._set_grad_enabled(enabled)  # noqa: SLF001
        value = ring.copy(stacked, len(norms))
        if value is not None:
            return value, extra is not None
        # No row free (a sampler far behind): a copy of its own, without the extra.
        return DeviceValue(stacked[: len(norms)]), False

    def take(
        self, into_row: bool = True
    ) -> tuple[
        DeviceValue | HostRing | tuple[torch.Tensor, ...] | None,
        tuple[int, ...] | None,
        NormLayout | None,
    ]:
        """The packed values, the parameter each belongs to (None: all, in order) and how to
        unpack them (None: they are norms); ``(None, None, None)`` without gradients.

        A model converted or moved after attach (``model.double()``, ``.to("cuda")``) is
        planned again: one look at the first parameter per step sees it, and a failure on the
        way (a parameter converted alone) plans again once before it counts as an error."""
        params = self.params
        if params and (params[0].dtype, params[0].device) != self._planned_for:
            self._replan()
        try:
            return self._take(params, into_row)
        except (RuntimeError, NotImplementedError):
            self._replan()
            return self._take(params, into_row)

    def _take(
        self, params: list[torch.nn.Parameter], into_row: bool = True
    ) -> tuple[
        DeviceValue | HostRing | tuple[torch.Tensor, ...] | None,
        tuple[int, ...] | None,
        NormLayout | None,
    ]:
        grads = [g for p in params if (g := p.grad) is not None]
        if not grads:
            return None, None, None
        if self.deferred and len(grads) == len(params):
            try:  # one fused launch; stacked and copied at the step's end (cross)
                return _foreach_norm(grads, 2, dtype=self.dtype), None, None
            except (RuntimeError, NotImplementedError):
                pass  # sparse gradients: the general path
        if len(grads) != len(params):
            which = tuple(i for i, p in enumerate(params) if p.grad is not None)
            return grad_norms(grads, self.dtype), which, None
        plan = self.plan
        host = self.host
        # HostRing.row(), written out: the step's row, unless none is free.
        if into_row and host is not None and host.seq - host.freed < host.size:
            row = host.rows[host.seq % host.size]
            try:
                if plan is None:
                    torch.stack(_foreach_norm(grads, 2, dtype=self.dtype), out=row)
                    return host, None, None
                # _take_cpu()'s values, written into the row (one call less a step).
                if plan.dots:
                    flat = self._flat
                    host.head = [
                        torch.dot(f, f).item() for f in [flat(grads[i], -1) for i in plan.dots]
                    ]
                else:
                    host.head = NO_HEAD
                tail = [grads[i] for i in plan.concat]
                if plan.rest:
                    rest = _foreach_norm([grads[i] for i in plan.rest], 2, dtype=plan.dtype)
                    tail.insert(0, torch.stack(rest))
                torch.cat(tail, out=row)
                return host, plan.order, plan.layout
            except (RuntimeError, NotImplementedError):
                pass  # a sparse or non-contiguous gradient: the ways below
        if plan is not None:
            try:
                value = _take_cpu(grads, plan, self._flat)
            except (RuntimeError, NotImplementedError):
                if self._flat is torch.Tensor.view:
                    # A non-contiguous gradient (channels_last): reshape from now on.
                    self._flat = torch.Tensor.reshape
                    return self._take(params, into_row)
                # a sparse or odd gradient this step: the general path below
            else:
                return value, plan.order, plan.layout
        return grad_norms(grads, self.dtype), None, None


def _take_cpu(
    grads: list[torch.Tensor], plan: CpuPlan, flat: Callable[[torch.Tensor, int], torch.Tensor]
) -> DeviceValue:
    # Each dot product is read at once: a float costs less than the view stack() makes of
    # every one of them (a new tensor right after backward() costs microseconds). CPU tensors
    # only (cpu_plan() is None anywhere else), so item() is a memory read, never a device sync.
    if plan.dots:
        flats = [flat(grads[i], -1) for i in plan.dots]
        head = [torch.dot(f, f).item() for f in flats]
    else:
        head = NO_HEAD
    tail = [grads[i] for i in plan.concat]
    if plan.rest:
        norms = _foreach_norm([grads[i] for i in plan.rest], 2, dtype=plan.dtype)
        tail.insert(0, torch.stack(norms))
    # DeviceValue.packed(), without its call.
    return DeviceValue(None, head, torch.cat(tail) if tail else None)


class GradNormProbe(ProbeBase):
    """Per-parameter gradient norms of every step, taken as ``clip_grad_norm_`` starts when the
    loop clips, else before the optimizer step (gradients are final at both), and handed to
    the step's record; with ``raise_non_finite`` it checks
    them on the host and raises ``NonFiniteError`` before the bad update (a sync by design)."""

    name = "grad_norms"

    def __init__(
        self,
        guard: Guard,
        params: list[torch.nn.Parameter],
        names: list[str],
        raise_non_finite: bool = False,
    ) -> None:
        super().__init__(guard)
        self.norm_pass = NormPass(params, defer=not raise_non_finite)
        self.names = names
        self.raise_non_finite = raise_non_finite

    def events(self) -> tuple[str, ...]:
        return ("clip", "pre_step")

    def clip(self, ctx: StepContext) -> None:
        # Before clip_grad_norm_ scales them: the norms grad_norm means (intercept.py).
        recorder = ctx.recorder
        # Into a HostRing row only when the step can be a row of columns (Recorder.end_step:
        # a block is open or the last step is held); else packed as a record's value at once.
        ctx.norms = self.norm_pass.take(recorder.block is not None or 0 in recorder.held)
        ctx.cross = self.norm_pass.cross

    def pre_step(self, ctx: StepContext) -> None:
        if not ctx.clips:
            recorder = ctx.recorder
            ctx.norms = self.norm_pass.take(recorder.block is not None or 0 in recorder.held)
            ctx.cross = self.norm_pass.cross
        # Checked here, not at the clip: a GradScaler's inf step never reaches the optimizer.
        if self.raise_non_finite:
            self._raise_if_non_finite(ctx)

    def _raise_if_non_finite(self, ctx: StepContext) -> None:
        taken, index, layout = ctx.norms
        # (A HostRing is not used in this mode: NormPass keeps none then.)
        norms = taken.value() if isinstance(taken, HostRing) else taken
        if norms is None or isinstance(norms, tuple):
            return
        norms.wait()  # opt-in: raise mode synchronises by design
        squares = squared_norms(norms.array(), layout).tolist()
        if all(map(_finite, squares)):
            return
        owners = index or range(len(self.names))
        pairs = sorted(zip(owners, squares, strict=True))  # "first" in parameter order
        bad = [self.names[i] for i, v in pairs if not _finite(v)]
        # The stop is an event of the run: the sampler writes it to the run log.
        ctx.recorder.put(AuxRecord(ctx.step + 1, "stopped", tuple(bad), STOP_MARK))
        raise NonFiniteError(
            f"nbmonitor: non-finite gradient at step {ctx.step + 1}, first in {name_list(bad)}; "
            "the optimizer step was not taken (on_nan='raise')."
        )


def _finite(value: float) -> bool:
    return value - value == 0.0


__all__ = [
    "DOT_MIN_NUMEL",
    "GradNormProbe",
    "NormPass",
    "cpu_plan",
    "grad_norms",
    "norm_dtype",
]
