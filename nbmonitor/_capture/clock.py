"""The step clock: the model's and optimizer's root hooks, and what the training thread does for
nbmonitor at each of them, and nothing more.

It counts optimizer steps (backward passes without an optimizer), micro-batches and samples,
times each step, and at the end of a step hands its values to the recorder (``Recorder.end_step``:
a row of columns, or a ``StepRecord``). The measurements are
probes (``probes/``), each called at the moments it declares and behind its own Guard: a probe
that keeps failing is switched off while the clock and the other probes go on.
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nbmonitor._capture import adopt, frameworks, inputs, intercept, optimizer_kind
from nbmonitor._capture.backward_end import BackwardEnd
from nbmonitor._capture.backward_loss import BackwardLoss
from nbmonitor._capture.closure import after_closure
from nbmonitor._capture.device_value import DeviceValue, RingElement, RingValue
from nbmonitor._capture.inputs import (
    TOKEN_DTYPES,
    batch_size,
    batch_tokens,
    first_tensor,
    forward_counts,
    learning_rates,
    output_loss,
)
from nbmonitor._capture.phases import (
    END,
    FORWARD_END,
    FORWARD_START,
    INTO,
    OPTIMIZER_START,
    PHASE_ZEROS,
    EventIntervals,
    PhaseTimer,
)
from nbmonitor._capture.probes.base import NO_NORMS, Probe, StepContext, next_due
from nbmonitor._capture.probes.grad_norms import GradNormProbe, NormPass
from nbmonitor._capture.probes.structure import StructureProbe, optimizer_facts
from nbmonitor._capture.recorder import (
    BLOCK_ROWS,
    LogValueError,
    Recorder,
    StepBlock,
    make_log_record,
)
from nbmonitor.errors import ErrorLog, Guard, NonFiniteError
from nbmonitor.records import LogRecord

# A hook that torch.compile runs as it is, untraced (torch.compiler.disable, typed here).
_eager: Callable[[Callable[..., None]], Callable[..., None]] = torch.compiler.disable
# The root hooks hand over to their _eager copy (dynamo's frame evaluation off for all they
# call) only inside torch.compile: while dynamo traces them (it reads is_compiling() as a
# constant true) or runs them inside a compiled region (its frame callback is set, and it would
# compile each function they call). Elsewhere the wrapper would cost ~1.5 us a call; these two
# tests cost ~0.2. A torch without the callback's getter gets the wrapper at every call.
_compiling = torch.compiler.is_compiling
_dynamo_frames: Callable[[], object] = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None),  # noqa: SLF001
    "get_eval_frame_callback",
    lambda: True,
)
_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor  # (one global load where the hooks test a type)


# The phase each mark closes, by the mark before it (phases.INTO): the marks the hooks write out
# while the timer is ``fast``.
_INTO_FORWARD_START = INTO[FORWARD_START]
_INTO_FORWARD_END = INTO[FORWARD_END]
_INTO_OPTIMIZER_START = INTO[OPTIMIZER_START]
_INTO_END = INTO[END]

# No learning rate is this (StepClock._lr_one before one is read, or with several groups).
_NOT_SEEN = object()

# What a probe is called with at each moment, in order: (its guard, its bound method).
_Calls = tuple[tuple[Guard, Callable[..., None]], ...]

# One Guard each ("forward" guards an adapter's batch_started too; "optimizer_pre_step" adoption;
# "loss" the backward passes' roots and GradScaler.scale).
_HOOKS = "forward_pre forward backward optimizer_pre_step optimizer_post_step clip scaler_step loss"


# The most backward passes held as one step while no optimizer has stepped and the gradients
# were never reset between them (see _Held): past it, the loop's passes are taken as its steps.
MAX_HELD = 64


class _Held:
    """A backward pass that ended with no optimizer known, whose step is not ended yet: the
    loop may be accumulating gradients for an optimizer that has not stepped yet (adopted at
    its first step, which then includes these micro-batches: the HF Trainer builds its
    optimizer inside ``train()``), or stepping by hand (each pass a step). The next forward
    tells them apart: gradients reset since the pass (``zero_grad``, set to None or zeroed in
    place) mean a step of its own; left as they were, they are still accumulating. One of the
    model's gradients is watched (weakly), by identity and in-place version."""

    __slots__ = ("_grad", "_param", "_version", "at", "forwarded", "wall")

    def __init__(self, param: torch.nn.Parameter, grad: torch.Tensor, at: float, wall: float):
        self._param = weakref.ref(param)
        self._grad = weakref.ref(grad)
        # Tensor._version counts in-place writes (autograd's own check, stable for years).
        self._version = grad._version  # noqa: SLF001
        self.at = at  # when the pass ended (the step clock's time, and the wall clock's)
        self.wall = wall
        self.forwarded = False  # the model's next forward has run (the next micro-batch)

    @classmethod
    def of(cls, model: torch.nn.Module | None, at: float, wall: float) -> _Held | None:
        """The pass just ended, watched through the first parameter with a gradient (None
        when there is none to watch: the pass is then a step at once)."""
        for p in model.parameters() if model is not None else ():
            if p.grad is not None:
                return cls(p, p.grad, at, wall)
        return None

    def reset(self) -> bool:
        """Whether the watched gradient was reset (or is gone) since the pass."""
        param = self._param()
        grad = param.grad if param is not None else None
        if grad is None or grad is not self._grad():
            return True
        return grad._version != self._version  # noqa: SLF001


class StepClock:
    """Installs the root hooks on one model (and optimizer) and keeps the training-side counters.

    ``step`` is the number of completed optimizer steps (or backward passes without an
    optimizer). All state here is written by the training thread only.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        recorder: Recorder,
        errors: ErrorLog,
        probes: Sequence[Probe] = (),
        *,
        phases: PhaseTimer | None = None,
        keep_forward_pre: bool = False,
        start_step: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        accumulation: Callable[[], int] | None = None,
    ) -> None:
        # Weakly: the model's hooks hold this clock, so a strong reference back would make a
        # cycle that keeps a dropped model (and its GPU memory) until a full garbage collection.
        self._model_ref = weakref.ref(model)
        self.optimizer = optimizer
        self.recorder = recorder
        self.probes = tuple(probes)
        self.phases = phases or PhaseTimer(Guard("probe:phases", errors), clock, enabled=False)
        # Steps done before (a resumed run): numbering goes on from there.
        self.ctx = StepContext(recorder, step=start_step)
        self._clock = clock
        self._wall_clock = wall_clock
        self._keep_forward_pre = keep_forward_pre
        self._guards = {name: Guard(f"hook:{name}", errors) for name in _HOOKS.split()}
        self._log_guard = Guard("log", errors)
        # The hot hooks' guards, one attribute load each.
        self._forward_pre_guard = self._guards["forward_pre"]
        self._forward_guard = self._guards["forward"]
        self._pre_step_guard = self._guards["optimizer_pre_step"]
        self._post_step_guard = self._guards["optimizer_post_step"]
        self._loss_guard = self._guards["loss"]
        self._clip_guard = self._guards["clip"]
        # Per moment, the (guard, bound method) of each probe that acts then, in order: on
        # the step in progress (``_at``), on any step (``_steady``), on a step a sampled probe
        # takes (``_sampled``, every probe), the next of which is ``_next_sampled``.
        self._at: dict[str, _Calls] = {}
        self._steady = self._sampled = self._at
        self._next_sampled = 0
        # The gradient-norm probe, called by the clock itself (not through _call) on a step
        # where it is the only probe due before the optimizer step (see _plan_calls).
        self._norms_probe = next((p for p in self.probes if isinstance(p, GradNormProbe)), None)
        self._norms_direct: GradNormProbe | None = None
        self._norm_pass: NormPass | None = None
        self._plan_calls()
        # The structural watch (probes/structure.py): the clock tells it of a backward's start,
        # a step's start and a scaled loss only while it is armed (a sampled step's).
        self.watch: StructureProbe | None = next(
            (p for p in self.probes if isinstance(p, StructureProbe)), None
        )
        if self.watch is not None:
            self.watch.bind(self.ctx, lambda: self.optimizer)
        self._samples = 0
        self._tokens = 0
        # Called with the new step number at the end of each step, after its record (the
        # profiler's schedule); each behind its caller's guard.
        self.step_listeners: list[Callable[[int], None]] = []
        self._step_start: float | None = None
        self._last_end: float | None = None
        self._backward = BackwardEnd(self._backward_end, self._guards["backward"])
        self._forwarded = False  # a grad-enabled forward ran in the step in progress
        # The last step was a backward pass with no forward since; an optimizer adopted now
        # (adopt.py) absorbs its first step into it.
        self._backward_ended = False
        self._absorb = False
        # Without an optimizer, the first backward pass is held, not ended as a step, until
        # the loop shows what it is (see _hold): the micro-batches of an optimizer step still
        # to be adopted (gradient accumulation) or a step of their own. ``_backward_only``
        # once gradients were reset between passes with no optimizer stepping.
        self._held: _Held | None = None
        self._backward_only = False
        # An adapter counts micro-batches and samples (batch_started); forwards then do not.
        self._batches_counted = False
        self.handles: list[
            RemovableHandle | adopt.GlobalHookHandle | frameworks.TrainingStepBatches
        ] = []
        self._pre_handle: RemovableHandle | None = None
        self._unlisten: Callable[[], None] | None = None
        self._param_ids: frozenset[int] = frozenset()
        self._n_groups = len(optimizer.param_groups) if optimizer is not None else 0
        # Inside GradScaler.step for our optimizer, and whether the optimizer stepped there.
        self._in_scaler_step = False
        self._stepped = False
        # ``accumulation``: the count a framework divides each micro-batch's loss by
        # (frameworks.py), or None.
        self._loss = BackwardLoss(self.ctx, accumulation)
        # The last learning rates read and the group values they were read from (see
        # _learning_rates): none yet.
        self._lrs: tuple[float | DeviceValue, ...] = ()
        self._lrs_seen: tuple[object, ...] = ()
        # The one group's learning rate read last, a number (else _NOT_SEEN: read it again).
        self._lr_one: object = _NOT_SEEN
        self._step_depth = 0  # optimizer.step() calls under way (see _step_pre)
        # The last step's loss tensor that crossed with its norms (CUDA, _cross): (step, the
        # tensor, its version then, its value in the crossing); mon.log of that tensor for that
        # step is then folded in without a copy of its own.
        self._crossed: tuple[int, torch.Tensor, int, RingElement] | None = None

    @property
    def step(self) -> int:
        return self.ctx.step

    @property
    def log_step(self) -> int:
        """The step a value logged now belongs to.

        Once a grad-enabled forward has run since the last step ended, the value belongs to the
        step in progress; otherwise to the step that just ended (``mon.log`` after ``step()``).
        """
        return self.ctx.log_step

    # -- lifecycle ----------------------------------------------------------------------------

    def install(self) -> None:
        try:
            self._install()
        except BaseException:
            self.remove()  # what was installed before the failure
            raise

    def _install(self) -> None:
        m = self._model_ref()
        if m is None:
            raise RuntimeError("the model was deleted before its monitor started")
        # Probes' own per-module hooks go first so that they have run when the root's own hook
        # hands the step to the probes.
        for probe in self.probes:
            self.handles.extend(probe.install(m))
        # The pre-hook only times the first step's start (later steps start when the previous
        # one ended) and lets probes open per-step sampling; unless a probe needs it, it goes
        # after step 1.
        # Under torch.compile the root hooks run eagerly, at the compiled graph's edges: traced,
        # their clock reads and Python state would break the graph (and warn) every forward.
        # Outside torch.compile the hook is a plain call (see _compiling).
        self._pre_handle = m.register_forward_pre_hook(self._forward_pre)
        self.handles.append(self._pre_handle)
        self.handles.append(m.register_forward_hook(self._forward, with_kwargs=True))
        # A LightningModule attached without the callback: its training_step starts each
        # micro-batch (frameworks.py).
        batches = frameworks.watch_batches(m, self.batch_started)
        if batches is not None:
            self.handles.append(batches)
        self._param_ids = frozenset(id(p) for p in m.parameters())
        # The backward passes' roots (the loss) are read with or without an optimizer.
        self._unlisten = intercept.listen(self)
        if self.optimizer is not None:
            self._watch_optimizer(self.optimizer)
        else:
            # Backward passes are steps (ending before any clip; the first held until the loop
            # shows what it is, see _Held) until an optimizer steps the model's parameters:
            # that one is adopted (adopt.py).
            self.handles.extend(adopt.watch_optimizers(self))

    def _watch_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        # Once, when the optimizer becomes this clock's: what it is, for the time rules. A
        # failure here costs only the suggestion, counted like a hook's.
        try:
            self.recorder.put(optimizer_kind.describe(optimizer, self.ctx.step))
            if self.watch is not None:
                m = self._model_ref()
                names = {id(p): n for n, p in m.named_parameters()} if m is not None else {}
                self.recorder.put(optimizer_facts(optimizer, names, self.ctx.step))
        except Exception as exc:
            self._guards["optimizer_pre_step"].failed(exc)
        self.handles.append(optimizer.register_step_pre_hook(self._step_pre))
        self.handles.append(optimizer.register_step_post_hook(self._step_post))
        self.handles.extend(self.phases.install(self._model_ref()))  # the backward's end

    def adopt(self, optimizer: torch.optim.Optimizer) -> bool:
        """Make ``optimizer`` this clock's if it steps the model, from this step on (adopt.py)."""

        def work() -> None:
            if adopt.steps_any(optimizer, self._param_ids):
                self.optimizer = optimizer
                self._n_groups = len(optimizer.param_groups)
                # The backward pass just counted as a step was this optimizer step's.
                self._absorb = self._backward_ended
                self._watch_optimizer(optimizer)

        self._guarded("optimizer_pre_step", work)
        return self.optimizer is optimizer

    def remove(self) -> None:
        if self._held is not None:  # the run ends: the pass held was a step
            self._guarded("backward", lambda: self._release(backward_only=False))
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        # A forward that raised leaves FlopCounterMode entered (its global module hooks and its
        # dispatch mode) until the next forward: closing must not leave it for good.
        for probe in self.probes:
            try:
                probe.close()
            except Exception as exc:
                probe.guard.failed(exc)
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        self.release_losses()

    def log(self, scalars: Mapping[str, object]) -> None:
        """Record ``scalars``; a value it cannot use is the caller's bug (TypeError or
        ``LogValueError``, a ValueError, raised at the call), anything
        else that goes wrong is nbmonitor's and is only counted."""
        guard = self._log_guard
        if not guard.on:
            return
        ctx = self.ctx
        recorder = self.recorder
        if len(scalars) == 1:
            # mon.log(loss=loss) of a float CPU tensor or a float, most loops' only call: what
            # make_log_record does for it, written out (item() reads it at once, DeviceValue's
            # way on the CPU; anything else takes the whole way below). Logged once the step
            # has ended, it goes into the step's record (Recorder.fold_loss).
            value = scalars.get("loss")
            crossed = self._crossed
            logged = -1  # the step the loss was logged for, once it is
            if crossed is not None and value is crossed[1] and not ctx.micro:
                # The tensor the step's backward started from, crossed with its norms.
                step, root, version, element = crossed
                if (
                    step == ctx.step
                    and root._version == version  # noqa: SLF001
                    and recorder.fold_loss(step, element)
                ):
                    logged = step
            if logged < 0:
                number: object = value
                if type(value) is _Tensor and value.is_cpu:
                    try:
                        number = value.item()
                    except RuntimeError:
                        number = None  # several values: refused below, with its message
                if type(number) is float:
                    if ctx.micro:  # the step in progress: a record, after the one held
                        logged = ctx.step + 1
                        recorder.put(LogRecord(logged, {"loss": number}))
                    else:
                        logged = ctx.step
                        # Recorder.fold_loss(), its usual case written out: the step's row,
                        # held, taken (one atomic pop: the sampler may hand it on) and put
                        # back with its loss.
                        held = recorder.held
                        block = held.pop(0, None)
                        folded = False
                        if block.__class__ is StepBlock:
                            last = block.w - 1
                            column = block.loss
                            if block.step + last == logged and column[last] is None:
                                column[last] = number
                                folded = True
                        if block is not None:
                            held[0] = block
                        if not folded and not recorder.fold_loss(logged, number):
                            # (after the step's record held, if any: in the order logged)
                            recorder.put(LogRecord(logged, {"loss": number}))
            if logged >= 0:
                # _logged_loss(), written out: no call a step.
                loss = self._loss
                loss.logged_step = logged
                pending = loss.pending
                try:
                    if pending and pending[0][0] == logged:
                        pending.clear()
                except IndexError:  # emptied by a flushing thread between the test and the read
                    pass
                return
        try:
            record = make_log_record(ctx.step + 1 if ctx.micro else ctx.step, scalars)
        except (TypeError, LogValueError):
            raise
        except Exception as exc:
            guard.failed(exc)
            return
        recorder.put(record)  # after the step's record held, if any: in the order logged
        if "loss" in scalars:
            self._logged_loss(record.step)

    def _logged_loss(self, step: int) -> None:
        """The loop logged ``step``'s loss: its backward roots are not needed, and are dropped
        now rather than released (to no record) by the next forward, one call a step less."""
        loss = self._loss
        loss.logged_step = step
        pending = loss.pending
        try:
            # Roots of earlier steps stay for release(), which records them; a step's roots
            # are all later than those (the deque is in step order).
            if pending and pending[0][0] == step:
                pending.clear()
        except IndexError:  # emptied by a flushing thread between the test and the read
            pass

    def release_losses(self) -> None:
        """Record the backward passes' losses still kept (``backward_loss.py``): at
        ``flush()`` and ``close()``; never raises."""
        guard = self._guards["loss"]
        try:
            self.recorder.release()  # the last step's record, then its roots' loss
            self._loss.release()
        except Exception as exc:
            guard.failed(exc)

    # -- probes -------------------------------------------------------------------------------

    def _plan_calls(self) -> None:
        self._sampled = self._plan(self.probes)
        self._steady = self._plan([p for p in self.probes if not p.sampled])
        self._next_sampled = self.ctx.step + 1
        self._plan_step(self.ctx.step + 1)
        # On a steady step whose only probe before the optimizer step (and at a clip) is the
        # gradient norms', the clock calls that probe itself: no dispatch loop, one call less.
        probe = self._norms_probe
        only = ((probe.guard, probe.pre_step),) if probe is not None else None
        clip_only = ((probe.guard, probe.clip),) if probe is not None else None
        steady = self._steady
        self._norms_direct = (
            probe
            if probe is not None
            and probe in self.probes
            and steady["pre_step"] == only
            and steady["clip"] == clip_only
            else None
        )
        # Its pass, taken by the pre-step hook itself when there is nothing to check after it
        # (GradNormProbe.pre_step's usual case), and how its deferred norms cross (the same
        # bound method every step: set once, not made a step).
        direct = self._norms_direct
        self._norm_pass = None
        if direct is not None:
            self.ctx.cross = direct.norm_pass.cross
            if not direct.raise_non_finite:
                self._norm_pass = direct.norm_pass

    def _plan(self, probes: Sequence[Probe]) -> dict[str, _Calls]:
        return {
            "forward_pre": self._calls(probes, "forward_pre", lambda p: p.forward_pre),
            "forward": self._calls(probes, "forward", lambda p: p.forward),
            "clip": self._calls(probes, "clip", lambda p: p.clip),
            "pre_step": self._calls(probes, "pre_step", lambda p: p.pre_step),
            "post_step": self._calls(probes, "post_step", lambda p: p.post_step),
        }

    @staticmethod
    def _calls(
        probes: Sequence[Probe], event: str, method: Callable[[Probe], Callable[..., None]]
    ) -> _Calls:
        return tuple((p.guard, method(p)) for p in probes if event in p.events())

    def _plan_step(self, step: int) -> None:
        """The calls of ``step`` (1-based): every probe's on a step a sampled probe takes,
        else only those of the probes that act at every step."""
        if step < self._next_sampled:
            self._at = self._steady
            return
        self._at = self._sampled
        everies = {p.every for p in self.probes if p.sampled}
        self._next_sampled = min((next_due(step + 1, e) for e in everies), default=step + 1)
        if step not in {next_due(step, e) for e in everies}:
            self._at = self._steady  # (after a plan made mid-run: retired probes, a restart)

    def _call(self, calls: _Calls, *args: Any) -> None:
        ctx = self.ctx
        for guard, call in calls:
            if not guard.on:
                continue
            try:
                call(ctx, *args)
            except NonFiniteError:
                raise
            except Exception as exc:
                guard.failed(exc)
            else:
                if guard.in_a_row:
                    guard.ok()
        if ctx.retired:  # a probe done for good: the moments' calls without it
            self.probes = tuple(p for p in self.probes if p not in ctx.retired)
            ctx.retired.clear()
            self._plan_calls()

    # -- hooks --------------------------------------------------------------------------------

    def _forward_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if _compiling() or _dynamo_frames() is not None:  # under torch.compile (see _eager)
            return self._forward_pre_eager(module, args)
        guard = self._forward_pre_guard
        if not guard.on or not _grad_enabled():
            return None
        try:
            if self._held is not None and self._held.reset():
                self._release(backward_only=True)
            phases = self.phases
            if phases.fast:  # PhaseTimer.forward_start(), written out
                t = phases.clock()
                phases.sums[_INTO_FORWARD_START[phases.last]] += t - phases.t
                phases.t = t
                phases.last = FORWARD_START
            else:
                phases.forward_start()
            if self._step_start is None:
                self._step_start = self._clock()
            calls = self._at["forward_pre"]
            if calls and not self._forwarded:
                self._call(calls)
        except Exception as exc:
            guard.failed(exc)
        return None

    # The hooks' copies that dynamo runs untraced (class attributes: an instance's own would
    # be a reference cycle through its bound method).
    _forward_pre_eager = _eager(_forward_pre)

    def _forward(
        self,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        if _compiling() or _dynamo_frames() is not None:  # as in _forward_pre
            return self._forward_eager(module, args, kwargs, output)
        guard = self._forward_guard
        if not guard.on or not _grad_enabled():
            return None
        try:
            # Without an optimizer the step ends with the backward: _backward marks it.
            phases = self.phases
            if phases.fast:  # PhaseTimer.forward_ended(), written out
                t = phases.clock()
                phases.sums[_INTO_FORWARD_END[phases.last]] += t - phases.t
                phases.t = t
                phases.last = FORWARD_END
            else:
                phases.forward_ended(output, self.optimizer is not None)
            # A micro-batch counts once its forward has run (a forward that raised is none).
            ctx = self.ctx
            self._forwarded = True
            self._crossed = None  # values logged now belong to the step in progress
            self._backward_ended = False
            if self._held is not None:
                self._held.forwarded = True
            # forward_counts(), its usual case written out (one tensor argument): a shape read.
            first = args[0] if args and not kwargs else None
            if type(first) is _Tensor:
                shape = first.shape
                if len(shape) == 2 and first.dtype in TOKEN_DTYPES:
                    samples, tokens = shape[0], shape[0] * shape[1]
                else:
                    samples, tokens = (shape[0] if shape else 1), 0
            else:
                samples, tokens = forward_counts(args, kwargs)
            if not self._batches_counted:
                ctx.micro += 1
                self._samples += samples
                self._tokens += tokens
            if self._loss.pending:  # the last step's losses, unless the loop logged one
                self._loss.release(ctx.step)
            calls = self._at["forward"]
            if calls:
                # (read by a probe's forward only: the FLOPs count's)
                ctx.forward_samples, ctx.forward_tokens = samples, tokens
                self._call(calls, output)
            if self.optimizer is None:
                loss = output_loss(output)
                # Without an optimizer a step is a backward pass through the output.
                self._backward.watch(loss if loss is not None else first_tensor(output))
            if guard.in_a_row:
                guard.ok()
        except NonFiniteError:
            raise
        except Exception as exc:
            guard.failed(exc)
        return None

    _forward_eager = _eager(_forward)

    def _guarded(self, hook: str, work: Callable[[], None]) -> None:
        """Run a hook's ``work`` behind that hook's guard: a failure drops the step's pending
        norms and is counted; ``NonFiniteError`` (``on_nan="raise"``) reaches the loop."""
        guard = self._guards[hook]
        if not guard.on:
            return
        try:
            work()
            if guard.in_a_row:
                guard.ok()
        except NonFiniteError:
            self.ctx.norms = NO_NORMS
            raise
        except Exception as exc:
            self.ctx.norms = NO_NORMS
            guard.failed(exc)

    def _backward_end(self) -> None:
        self._guarded("backward", self._end_backward_step)

    def _end_backward_step(self) -> None:
        if self.optimizer is not None:
            return  # adopted since this pass's forward: the optimizer's step ends the step
        self._call(self._at["pre_step"])
        if not self._backward_only:
            if self.ctx.micro < MAX_HELD:
                held = _Held.of(self._model_ref(), self._clock(), self._wall_clock())
                if held is not None:
                    self._held = held  # the newest pass of the step so far
                    return
            else:  # accumulating this long with no optimizer: its passes are its steps
                self._backward_only = True
        self._end_step()
        self._backward_ended = True

    def _release(self, backward_only: bool) -> None:
        """End the held backward pass's step where it ended (``backward_only``: the loop has
        shown that its backward passes are its steps; they end at once from now on)."""
        held, self._held = self._held, None
        self._backward_only = self._backward_only or backward_only
        if held is not None:
            self._end_step(now=held.at, wall=held.wall)
            self._backward_ended = True

    def batch_started(self, inputs: object) -> None:
        """An adapter's micro-batch starts (``Monitor.batch_started``): forwards no longer count."""

        def work() -> None:
            self._batches_counted = True
            if self._step_start is None:
                self._step_start = self._clock()
            self.ctx.micro += 1
            self._samples += batch_size((inputs,), {})
            self._tokens += batch_tokens(inputs)
            if self._loss.pending:
                self._loss.release(self.ctx.step)

        self._guarded("forward", work)

    def _step_pre(
        self,
        optimizer: torch.optim.Optimizer,
        args: Any,
        kwargs: Any,
        closure_returned: bool = False,
    ) -> Any:
        """The optimizer's pre-step hook; the step's pre-step work runs here (a plain step, no
        call of its own), or once its closure returns (``closure_returned``)."""
        if not closure_returned:
            self._step_depth += 1
            if self._step_depth > 1 or self._absorb or kwargs or args[1:]:
                try:
                    if self._step_depth > 1 and inputs.nested_step(optimizer):
                        return None  # a subclass's step() calling super().step(): hooks twice
                    self._step_depth = 1  # (an earlier step that raised never reached its post)
                    if self._absorb:
                        return None
                    # step(closure) (Lightning, LBFGS): gradients are final once the closure
                    # returns. (args holds the optimizer itself: a closure makes it longer, or
                    # is a keyword.)
                    wrapped = (
                        after_closure(
                            args,
                            kwargs,
                            functools.partial(self._step_pre, optimizer, args, kwargs, True),
                        )
                        if kwargs or len(args) > 1
                        else None
                    )
                except Exception as exc:  # never into the loop; the step is measured as usual
                    self._guards["optimizer_pre_step"].failed(exc)
                    wrapped = None
                if wrapped is not None:
                    return wrapped
        # _guarded(), written out: no closure made at each step.
        guard = self._pre_step_guard
        if guard.on:
            try:
                watch = self.watch
                if watch is not None and watch.pre_step_armed:
                    watch.pre_step_started(self.ctx.clips)
                at = self._at
                norms = self._norms_direct
                if norms is not None and at is self._steady:
                    # _call() for the one probe due, written out: no dispatch loop a step (and
                    # no call when a clip took the norms and there is nothing to check).
                    probe_guard = norms.guard
                    ctx = self.ctx
                    if probe_guard.on and (not ctx.clips or norms.raise_non_finite):
                        try:
                            norm_pass = self._norm_pass
                            if norm_pass is not None:
                                # GradNormProbe.pre_step(), its usual case written out (no
                                # clip took the norms, none to check): its pass's take().
                                recorder = self.recorder
                                ctx.norms = norm_pass.take(
                                    recorder.block is not None or 0 in recorder.held
                                )
                            else:
                                norms.pre_step(ctx)
                        except NonFiniteError:
                            raise
                        except Exception as exc:
                            probe_guard.failed(exc)
                        else:
                            if probe_guard.in_a_row:
                                probe_guard.ok()
                else:
                    self._call(at["pre_step"])
                if guard.in_a_row:
                    guard.ok()
            except NonFiniteError:
                self.ctx.norms = NO_NORMS
                raise
            except Exception as exc:
                self.ctx.norms = NO_NORMS
                guard.failed(exc)
        # After the probes: their work is "other".
        phases = self.phases
        if phases.fast:  # PhaseTimer.optimizer_start(), written out
            t = phases.clock()
            phases.sums[_INTO_OPTIMIZER_START[phases.last]] += t - phases.t
            phases.t = t
            phases.last = OPTIMIZER_START
        else:
            phases.optimizer_start()
        return None

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._step_depth -= 1
        if self._step_depth > 0:
            return
        self._stepped = True  # even with this hook's guard off: the scaler did not skip
        if self._absorb:
            self._absorb = False
            return
        # _guarded(), written out: no bound method made at each step.
        guard = self._post_step_guard
        if not guard.on:
            return
        try:
            calls = self._at["post_step"]
            if calls:
                self._call(calls)
            self._end_step()
            if guard.in_a_row:
                guard.ok()
        except NonFiniteError:
            self.ctx.norms = NO_NORMS
            raise
        except Exception as exc:
            self.ctx.norms = NO_NORMS
            guard.failed(exc)

    # -- the end of a step ----------------------------------------------------------------------

    def _end_step(
        self, skipped: bool = False, now: float | None = None, wall: float | None = None
    ) -> None:
        self._held = None  # adopted: the passes held are this optimizer step's micro-batches
        if now is None:
            now = self._clock()
        start = self._last_end
        if start is None:
            start = self._step_start
        step_time = now - start if start is not None else math.nan
        ctx = self.ctx
        step = ctx.step = ctx.step + 1
        if step + 1 < self._next_sampled:  # _plan_step(), its usual case inline
            self._at = self._steady
        else:
            self._plan_step(step + 1)
        taken, which, layout = ctx.norms
        ctx.norms = NO_NORMS
        # On the device and not crossed yet (CUDA): with the loss, now.
        norms = self._cross(taken) if isinstance(taken, tuple) else taken
        if ctx.clips:  # (clip_total and max_norm are set only at a clip: StepContext.clip_ended)
            clip_total = None if skipped else ctx.clip_total
            max_norm = ctx.max_norm
            ctx.clips, ctx.clip_total, ctx.max_norm = 0, None, math.nan
        else:
            clip_total, max_norm = None, math.nan
        phases = self.phases
        if phases.fast and phases.guard.on:  # PhaseTimer.step_end(), written out
            sums = phases.sums
            sums[_INTO_END[phases.last]] += now - phases.t
            phases.t = now
            phases.last = END
            durations: tuple[float, ...] | EventIntervals | None = tuple(sums)
            sums[:] = PHASE_ZEROS
            if phases.device_every and (step + 1) % phases.device_every == 0:
                phases.start_device()
        else:
            durations = phases.step_end(step, now)
        optimizer = self.optimizer
        if optimizer is None:
            added: tuple[tuple[int, int, int], ...] = ()
            lrs: tuple[float | DeviceValue, ...] = ()
        else:
            groups = optimizer.param_groups
            n = len(groups)
            if n != self._n_groups:
                added = inputs.groups_added(optimizer, self._n_groups, self._param_ids)
                self._n_groups += len(added)
            else:
                added = ()
            if n == 1 and groups[0].get("lr") is self._lr_one:
                lrs = self._lrs  # _learning_rates(), its usual case written out
            else:
                lrs = self._learning_rates(optimizer)
        # The step's one row of columns (or record), held until the next step ends
        # (Recorder.end_step: a loss logged after step() is folded in; the one held before is
        # put now).
        if wall is None:
            wall = self._wall_clock()
        recorder = self.recorder
        block = recorder.block
        written = False
        if (
            block is not None
            and norms is block.ring
            and norms is not None
            and clip_total is None
            and not skipped
            and not added
        ):
            # Recorder.end_step()'s usual case, written out (no call of 15 arguments): the row
            # before is the open block's, still held, and this one is like it (its gradient
            # values in the ring's next row, no clip, the same columns and learning rates).
            # Taken with the same atomic pop (the sampler may hand it on) and put back.
            held = recorder.held
            previous = held.pop(0, None)
            if previous is block:
                w = block.n = block.w  # the row before, published
                tokens = self._tokens
                if (
                    block.clip is None
                    and which is block.index
                    and layout is block.layout
                    and (block.tokens is None) is (not tokens)
                    and (
                        durations.__class__ is tuple
                        if block.phases is not None
                        else durations is None
                    )
                    and norms.seq == block.first + w
                    and lrs is block.lrs[-1]
                    and w < BLOCK_ROWS
                ):
                    if w == block.cap:
                        block.grow()
                    block.time[w] = wall
                    block.step_time[w] = step_time
                    block.samples[w] = self._samples
                    block.micro[w] = ctx.micro
                    if block.tokens is not None:
                        block.tokens[w] = tokens
                    if block.phases is not None:
                        block.phases[w] = durations  # type: ignore[assignment]
                    if block.heads is not None:
                        block.heads[w] = norms.head
                    norms.seq += 1  # (HostRing.commit)
                    block.w = w + 1
                    recorder.ended = step
                    written = True
            if previous is not None:
                held[0] = previous
        if not written:
            # Positional, in StepRecord's fields' order: keywords cost more.
            recorder.end_step(
                step,
                wall,
                step_time,
                self._samples,
                ctx.micro,
                lrs,
                norms,
                which,
                layout,
                clip_total,
                max_norm,
                skipped,
                added,
                self._tokens,
                durations,
            )
        self._last_end = now
        self._samples = 0
        self._tokens = 0
        ctx.micro = 0
        self._forwarded = False
        if not self._keep_forward_pre and self._pre_handle is not None:
            self._pre_handle.remove()
            self._pre_handle = None
        if self.step_listeners:
            for listener in tuple(self.step_listeners):
                listener(step)

    def held(self) -> None:
        """A step listener held the loop at this step's end (a pause, a checkpoint): the next
        step's time and its wait for data start now, not when the step ended."""
        now = self._clock()
        self._last_end = now
        self.phases.held_until(now)

    def _cross(self, norms: tuple[torch.Tensor, ...]) -> DeviceValue | RingValue:
        """The step's deferred norms on their way to the host, in one copy with the loss its
        backward started from (which a loop then logs: ``log`` folds it in)."""
        ctx = self.ctx
        cross = ctx.cross
        assert cross is not None  # set with the deferred norms (GradNormProbe)
        loss = self._loss
        root = loss.sole_root(ctx.step)
        value, crossed = cross(norms, root)
        if crossed and root is not None:
            element = RingElement(value, len(norms))
            self._crossed = (ctx.step, root, root._version, element)  # noqa: SLF001
            loss.crossed = (root, element)  # a loop that logs none: its root read from there
        else:
            self._crossed = loss.crossed = None
        return value  # type: ignore[no-any-return]

    def _learning_rates(
        self, optimizer: torch.optim.Optimizer | None
    ) -> tuple[float | DeviceValue, ...]:
        """Each param group's learning rate (``inputs.learning_rates``); the last step's tuple
        again while every group holds the same Python number object (a scheduler sets a new
        one, and a number never changes), so that a step with no change makes nothing new. A
        tensor (or array) learning rate may change in place: read at every step."""
        if optimizer is None:
            return ()
        groups = optimizer.param_groups
        seen = self._lrs_seen
        if len(groups) == len(seen):
            for group, lr in zip(groups, seen, strict=True):
                if group.get("lr") is not lr:
                    break
            else:
                return self._lrs
        lrs = learning_rates(optimizer)
        raw = tuple(group.get("lr") for group in groups)
        # Python numbers only: a 0-d array or a tensor may change in place.
        self._lrs_seen = raw if all(isinstance(lr, (float, int)) for lr in raw) else ()
        self._lr_one = self._lrs_seen[0] if len(self._lrs_seen) == 1 else _NOT_SEEN
        self._lrs = lrs
        return lrs

    # -- the clip, GradScaler and backward listeners (intercept.py sees the loop call them) ---

    def loss_scaled(self, scaled: torch.Tensor, loss: torch.Tensor) -> None:
        watch = self.watch
        if watch is not None and watch.backward_armed:
            watch.scaled = True
        if self.ctx.micro:
            self._guarded("loss", lambda: self._loss.scaled(scaled, loss))

    def backward_called(self, tensors: object, grad_tensors: object, keeps_graph: bool) -> None:
        # Only while this model's step is under way (a forward or an adapter's batch since the
        # last step ended, and since the pass held if one is): a backward of something else,
        # between steps, is not its loss.
        watch = self.watch
        if watch is not None and watch.backward_armed:
            watch.backward_started(tensors, self.ctx.micro > 0)  # guarded there
        held = self._held
        ctx = self.ctx
        if ctx.micro and grad_tensors is None and (held is None or held.forwarded):
            guard = self._loss_guard  # _guarded(), written out: no closure at each backward
            if not guard.on:
                return
            try:
                loss = self._loss
                pending = loss.pending
                if (
                    type(tensors) is _Tensor
                    and not keeps_graph
                    and not pending
                    and loss.last_scaled is None
                ):
                    # BackwardLoss.started(), its usual case written out (one root, no
                    # GradScaler, none pending: the loop logged the last step's loss, or the
                    # forward released it): the root kept as it is, no call at each backward.
                    step = ctx.step + 1  # ctx.log_step (a forward has run: micro > 0)
                    if step == loss.logged_step:
                        loss.kept = 0  # logged before its backward: not needed
                    else:
                        pending.append((step, tensors, tensors._version))  # noqa: SLF001
                        loss.kept = 1
                else:
                    loss.started(tensors, keeps_graph)
                if guard.in_a_row:
                    guard.ok()
            except Exception as exc:
                guard.failed(exc)

    def backward_failed(self) -> None:
        # Never raises: the loop's own exception is the one that goes on.
        try:
            self._loss.failed()
        except Exception as exc:
            self._loss_guard.failed(exc)

    def clip_started(self, params: list[torch.Tensor]) -> None:
        # Another model's clip (or one of no parameters) is not this step's; without an
        # optimizer (none adopted, no pass held) a step ends with its backward, before any clip.
        # (_guarded() written out: a loop that clips calls this every step.)
        if not params or id(params[0]) not in self._param_ids:
            return
        if self.optimizer is None and self._held is None:
            return  # no optimizer steps the model, nor may be about to (no pass held)
        guard = self._clip_guard
        if not guard.on:
            return
        ctx = self.ctx
        try:
            ctx.clips += 1
            if ctx.clips == 1:
                at = self._at
                norms = self._norms_direct
                if norms is not None and at is self._steady:
                    # _call() for the one probe due, written out.
                    probe_guard = norms.guard
                    if probe_guard.on:
                        try:
                            norms.clip(ctx)
                        except NonFiniteError:
                            raise
                        except Exception as exc:
                            probe_guard.failed(exc)
                        else:
                            if probe_guard.in_a_row:
                                probe_guard.ok()
                else:
                    self._call(at["clip"])
            if guard.in_a_row:
                guard.ok()
        except NonFiniteError:
            ctx.norms = NO_NORMS
            raise
        except Exception as exc:
            ctx.norms = NO_NORMS
            guard.failed(exc)

    def clip_done(self, params: list[torch.Tensor], total: torch.Tensor, max_norm: object) -> None:
        if not params or id(params[0]) not in self._param_ids:
            return
        if self.optimizer is None and self._held is None:
            return
        guard = self._clip_guard  # _guarded(), written out: no closure at each clip
        if not guard.on:
            return
        try:
            self.ctx.clip_ended(total, max_norm)
            if guard.in_a_row:
                guard.ok()
        except NonFiniteError:
            self.ctx.norms = NO_NORMS
            raise
        except Exception as exc:
            self.ctx.norms = NO_NORMS
            guard.failed(exc)

    def scaler_step_started(self, optimizer: object) -> None:
        if self._held is not None and isinstance(optimizer, torch.optim.Optimizer):
            # A GradScaler steps an optimizer not adopted yet, the passes held its
            # micro-batches: adopt it here, since a first step the scaler skips (inf/NaN
            # gradients, as the first steps of fp16 training often are) never reaches the
            # optimizer's own hooks, and the passes would be taken for steps of their own.
            self.adopt(optimizer)
        if optimizer is self.optimizer:
            self._in_scaler_step = True
            self._stepped = False

    def scaler_step_done(self, optimizer: object) -> None:
        if optimizer is not self.optimizer or not self._in_scaler_step:
            return
        self._in_scaler_step = False
        if not self._stepped:
            self._guarded("scaler_step", self._end_skipped_step)

    def _end_skipped_step(self) -> None:
        # inf/NaN, no step: it counts (as loops and HF's global_step do), marked skipped, without
        # norms of gradients not used.
        self.ctx.norms = NO_NORMS
        self._end_step(skipped=True)
