"""Model and optimizer hooks: what the training thread does for nbmonitor, and nothing more.

Every hook only appends a record to the Recorder. Gradient norms are taken on the device in the
optimizer pre-step hook (gradients are final there; ``_gradnorms``) and cross to the host later,
without a synchronisation. Every hook body is wrapped: an exception is reported to ``on_error``
and the user's loop goes on; a hook that keeps failing is switched off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nbmonitor._frame import name_list
from nbmonitor._gradnorms import NormLayout, NormPass, squared_norms
from nbmonitor._recorder import (
    AuxRecord,
    DeviceValue,
    LogRecord,
    Recorder,
    StepRecord,
    make_log_record,
)

ErrorSink = Callable[[str, BaseException], None]
# A step's gradient norms until the step ends: values, parameter index, layout (NormPass.take).
PendingNorms = tuple[DeviceValue | None, tuple[int, ...] | None, NormLayout | None]
NO_NORMS: PendingNorms = (None, None, None)

# The update ratio needs a copy of the parameters across optimizer.step(); above this size the
# copy is skipped (update ratio NaN) rather than risking an out-of-memory error.
UPDATE_COPY_MAX_BYTES = 2 * 2**30


class NonFiniteError(FloatingPointError):
    """Raised into the training loop with ``on_nan="raise"``: where NaN/Inf first appeared."""


# After this many consecutive failures a hook stops doing anything (its handle stays until close).
MAX_CONSECUTIVE_ERRORS = 5


def optimizer_parameters(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """The optimizer's parameters in group order, each once."""
    seen: set[int] = set()
    out: list[torch.nn.Parameter] = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def batch_size(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """Leading dimension of the first tensor among a forward call's inputs (0 if none)."""
    for value in (*args, *kwargs.values()):
        found = _first_tensor(value)
        if found is not None:
            return int(found.shape[0]) if found.dim() > 0 else 1
    return 0


def _first_tensor(value: object, depth: int = 0) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if depth >= 2:
        return None
    items: Any
    if isinstance(value, Mapping):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return None
    for item in items:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def output_loss(output: object) -> torch.Tensor | None:
    """The ``.loss`` (or ``["loss"]``) of a Hugging Face style model output, if it is a scalar."""
    if isinstance(output, torch.Tensor):
        return None
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    return None


class Hooks:
    """Installs the hooks on one model (and optimizer) and keeps the training-side counters.

    ``step`` is the number of completed optimizer steps (or backward passes without an
    optimizer). All state here is written by the training thread only.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        recorder: Recorder,
        on_error: ErrorSink,
        *,
        layer_every: int = 0,
        activations: bool = False,
        check_forward: bool = False,
        on_nan: str = "warn",
    ) -> None:
        self.model = model
        self.layer_every = layer_every
        self.activations = activations
        self.check_forward = check_forward
        self.on_nan = on_nan
        self.optimizer = optimizer
        self.recorder = recorder
        self._on_error = on_error
        self.step = 0
        self._samples = 0
        self._micro = 0
        self._step_start: float | None = None
        self._last_end: float | None = None
        self._pending_norms: PendingNorms = NO_NORMS
        self._backward_queued = False
        self._failures: dict[str, int] = {}
        self.handles: list[RemovableHandle] = []
        self._pre_handle: RemovableHandle | None = None
        names = {id(p): n for n, p in model.named_parameters()}
        params = optimizer_parameters(optimizer) if optimizer is not None else []
        # Tracked: the optimizer's parameters, then trainable ones it lacks (their gradients
        # still count in the total norm, as clip_grad_norm_(model.parameters()) would).
        self.n_optimized = len(params)
        held = {id(p) for p in params}
        params += [p for p in model.parameters() if p.requires_grad and id(p) not in held]
        self.params: list[torch.nn.Parameter] = params
        self.param_names: list[str] = [names.get(id(p), f"param{i}") for i, p in enumerate(params)]
        self.norm_pass = NormPass(params)
        self.update_copy_max_bytes = UPDATE_COPY_MAX_BYTES
        self.update_copy_skipped = False
        self._before: list[torch.Tensor] | None = None
        self._before_norms: torch.Tensor | None = None
        # Per-forward scratch for the opt-in forward checks and activation statistics.
        self._leaf_names = {
            m: n for n, m in model.named_modules() if not any(True for _ in m.children())
        }
        self._module_names = {m: n or "(root)" for n, m in model.named_modules()}
        self._fwd_rows: list[torch.Tensor] = []
        self._fwd_names: list[str] = []
        self._act_rows: list[torch.Tensor] = []
        self._act_names: list[str] = []
        self._act_on = False

    # -- lifecycle ----------------------------------------------------------------------------

    def install(self) -> None:
        m = self.model
        # Per-module hooks go first so that they have run when the root's own hook packs them.
        if self.check_forward:
            for module in self._module_names:
                self.handles.append(module.register_forward_hook(self._check_output))
        if self.activations:
            for module in self._leaf_names:
                self.handles.append(module.register_forward_hook(self._activation_stats))
        # The pre-hook only times the first step's start (later steps start when the previous
        # one ended) and opens activation sampling; without activations it goes after step 1.
        self._pre_handle = m.register_forward_pre_hook(self._forward_pre)
        self.handles.append(self._pre_handle)
        self.handles.append(m.register_forward_hook(self._forward, with_kwargs=True))
        if self.optimizer is not None:
            self.handles.append(self.optimizer.register_step_pre_hook(self._step_pre))
            self.handles.append(self.optimizer.register_step_post_hook(self._step_post))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    @property
    def log_step(self) -> int:
        """The step a value logged now belongs to.

        Once a grad-enabled forward has run since the last step ended, the value belongs to the
        step in progress; otherwise to the step that just ended (``mon.log`` after ``step()``).
        """
        return self.step + 1 if self._micro else self.step

    def log(self, scalars: Mapping[str, object]) -> None:
        """Record ``scalars``; a non-numeric value is the caller's bug (TypeError), anything
        else that goes wrong is nbmonitor's and is only counted."""
        try:
            record = make_log_record(self.log_step, scalars)
        except TypeError:
            raise
        except Exception as exc:
            self._failed("log", exc)
            return
        self.recorder.put(record)

    # -- error accounting -----------------------------------------------------------------------

    def _failed(self, source: str, exc: BaseException) -> None:
        self._failures[source] = self._failures.get(source, 0) + 1
        self._on_error(source, exc)

    def _enabled(self, source: str) -> bool:
        # The hooks test ``self._failures`` first: empty (no failure yet) is the usual case,
        # and right after backward() every Python call costs microseconds.
        return self._failures.get(source, 0) < MAX_CONSECUTIVE_ERRORS

    def _ok(self, source: str) -> None:
        if self._failures.get(source):
            self._failures[source] = 0

    # -- hooks --------------------------------------------------------------------------------

    def _forward_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        source = "hook:forward_pre"
        if not torch.is_grad_enabled() or (self._failures and not self._enabled(source)):
            return None
        try:
            if self._step_start is None:
                self._step_start = time.perf_counter()
            if self.activations and self._micro == 0:
                self._act_on = self._sampling_step()
            if self._failures:
                self._ok(source)
        except Exception as exc:
            self._failed(source, exc)
        return None

    def _forward(
        self,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        source = "hook:forward"
        if not torch.is_grad_enabled() or (self._failures and not self._enabled(source)):
            return None
        try:
            # A micro-batch counts once its forward has run (a forward that raised is none).
            self._micro += 1
            self._samples += batch_size(args, kwargs)
            self._pack_forward_rows()
            loss = output_loss(output)
            if loss is not None:
                self.recorder.put(make_log_record(self.log_step, {"loss": loss}))
            if self.optimizer is None:
                self._watch_backward(loss if loss is not None else _first_tensor(output))
            if self._failures:
                self._ok(source)
        except NonFiniteError:
            raise
        except Exception as exc:
            self._failed(source, exc)
        return None

    def _watch_backward(self, tensor: torch.Tensor | None) -> None:
        # Without an optimizer a step is a backward pass. A hook on the output's gradient queues a
        # callback that autograd runs once the whole backward pass has finished (as DDP does).
        if tensor is not None and tensor.requires_grad:
            tensor.register_hook(self._output_grad)  # type: ignore[no-untyped-call]

    def _output_grad(self, grad: torch.Tensor) -> None:
        try:
            if not self._backward_queued:
                self._backward_queued = True
                engine = torch.autograd.Variable._execution_engine
                engine.queue_callback(self._backward_end)
        except Exception as exc:
            self._failed("hook:backward", exc)
        return None

    def _backward_end(self) -> None:
        self._backward_queued = False
        source = "hook:backward"
        if self._failures and not self._enabled(source):
            return
        try:
            self._collect_norms()
            if self.on_nan == "raise":
                self._raise_if_non_finite()
            self._end_step()
            if self._failures:
                self._ok(source)
        except NonFiniteError:
            self._pending_norms = NO_NORMS
            raise
        except Exception as exc:
            self._failed(source, exc)

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        source = "hook:optimizer_pre_step"
        if self._failures and not self._enabled(source):
            return None
        try:
            self._collect_norms()
            if self.on_nan == "raise":
                self._raise_if_non_finite()
            if self.layer_every and self._sampling_step():
                self._snapshot_parameters()
            if self._failures:
                self._ok(source)
        except NonFiniteError:
            raise
        except Exception as exc:
            self._pending_norms = NO_NORMS
            self._failed(source, exc)
        return None

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        source = "hook:optimizer_post_step"
        if self._failures and not self._enabled(source):
            return None
        try:
            if self._before is not None:
                self._record_update()
            self._end_step()
            if self._failures:
                self._ok(source)
        except Exception as exc:
            self._before = None
            self._failed(source, exc)
        return None

    # -- opt-in per-layer measurements ----------------------------------------------------------

    def _sampling_step(self) -> bool:
        """Whether the step in progress is one of every ``layer_every`` (1-based steps)."""
        every = self.layer_every or 1
        return (self.step + 1) % every == 0

    def _snapshot_parameters(self) -> None:
        params = [p.detach() for p in self.params[: self.n_optimized]]
        if not params:
            return
        size = sum(p.numel() * p.element_size() for p in params)
        if size > self.update_copy_max_bytes:
            self.update_copy_skipped = True
            return
        norms = torch._foreach_norm(params, 2, dtype=torch.float32)
        self._before_norms = torch.stack([n.to(norms[0].device) for n in norms])
        self._before = list(torch._foreach_mul(params, 1.0))

    def _record_update(self) -> None:
        before, norms = self._before, self._before_norms
        self._before = self._before_norms = None
        if before is None or norms is None:
            return
        params = [p.detach() for p in self.params[: self.n_optimized]]
        torch._foreach_sub_(before, params)  # before - after: the update, in place
        delta = torch._foreach_norm(before, 2, dtype=torch.float32)
        packed = torch.cat([norms, torch.stack([d.to(norms.device) for d in delta])])
        names = tuple(self.param_names[: self.n_optimized])
        self.recorder.put(AuxRecord(self.step + 1, "update", names, DeviceValue(packed)))

    def _check_output(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not torch.is_grad_enabled():
            return None
        try:
            out = _first_tensor(output)
            if out is None or not out.is_floating_point():
                return None
            flag = (~torch.isfinite(out.detach())).any().to(torch.float32).reshape(1)
            inp = _first_tensor(args)
            if inp is not None and inp.is_floating_point() and inp.numel():
                x = inp.detach().to(torch.float32)
                stats = torch.stack(
                    [x.mean(), x.std() if x.numel() > 1 else x.mean() * 0, x.abs().max()]
                )
            else:
                stats = torch.full((3,), float("nan"), device=flag.device)
            self._fwd_rows.append(torch.cat([flag, stats.to(flag.device)]))
            self._fwd_names.append(self._module_names.get(module, type(module).__name__))
        except Exception as exc:
            self._failed("hook:check_forward", exc)
        return None

    def _activation_stats(
        self, module: torch.nn.Module, args: tuple[Any, ...], output: Any
    ) -> None:
        if not self._act_on or not torch.is_grad_enabled():
            return None
        try:
            out = _first_tensor(output)
            if out is None or not out.is_floating_point() or not out.numel():
                return None
            x = out.detach().to(torch.float32)
            std = x.std() if x.numel() > 1 else x.mean() * 0
            row = torch.stack([x.mean(), std, x.abs().max(), (x == 0).to(torch.float32).mean()])
            self._act_rows.append(row)
            self._act_names.append(self._leaf_names[module])
        except Exception as exc:
            self._failed("hook:activations", exc)
        return None

    def _pack_forward_rows(self) -> None:
        step = self.log_step
        if self._fwd_rows:
            rows, names = self._fwd_rows, tuple(self._fwd_names)
            self._fwd_rows, self._fwd_names = [], []
            packed = torch.stack([r.to(rows[0].device) for r in rows])
            if self.on_nan == "raise":
                flags = packed[:, 0].cpu()  # opt-in: raise mode synchronises by design
                if bool(flags.any()):
                    first = int(flags.nonzero()[0, 0])
                    mean, std, maxabs = (float(v) for v in packed[first, 1:].cpu())
                    raise NonFiniteError(
                        f"nbmonitor: non-finite output first in module {names[first]!r} at step "
                        f"{step} (its input: mean {mean:.3g}, std {std:.3g}, max |x| {maxabs:.3g})."
                    )
            self.recorder.put(AuxRecord(step, "forward", names, DeviceValue(packed.reshape(-1))))
        if self._act_rows:
            rows, names = self._act_rows, tuple(self._act_names)
            self._act_rows, self._act_names = [], []
            self._act_on = False
            packed = torch.stack([r.to(rows[0].device) for r in rows])
            self.recorder.put(
                AuxRecord(step, "activations", names, DeviceValue(packed.reshape(-1)))
            )

    def _raise_if_non_finite(self) -> None:
        norms, index, layout = self._pending_norms
        if norms is None:
            return
        norms.wait()  # opt-in: raise mode synchronises by design
        squares = squared_norms(norms.array(), layout).tolist()
        if all(map(_finite, squares)):
            return
        owners = index or range(len(self.params))
        pairs = sorted(zip(owners, squares, strict=True))  # "first" in parameter order
        bad = [self.param_names[i] for i, v in pairs if not _finite(v)]
        raise NonFiniteError(
            f"nbmonitor: non-finite gradient at step {self.step + 1}, first in {name_list(bad)}; "
            "the optimizer step was not taken (on_nan='raise')."
        )

    # -- helpers ------------------------------------------------------------------------------

    def _collect_norms(self) -> None:
        self._pending_norms = self.norm_pass.take()

    def _end_step(self) -> None:
        now = time.perf_counter()
        start = self._last_end if self._last_end is not None else self._step_start
        step_time = now - start if start is not None else float("nan")
        self.step += 1
        norms, which, layout = self._pending_norms
        self._pending_norms = NO_NORMS
        self.recorder.put(
            StepRecord(
                step=self.step,
                time=time.time(),
                step_time=step_time,
                samples=self._samples,
                micro_batches=self._micro,
                lrs=self._lrs(),
                norms=norms,
                norm_index=which,
                norms_layout=layout,
            )
        )
        self._last_end = now
        self._samples = 0
        self._micro = 0
        if not self.activations and self._pre_handle is not None:
            self._pre_handle.remove()
            self._pre_handle = None

    def _lrs(self) -> tuple[float | DeviceValue, ...]:
        if self.optimizer is None:
            return ()
        out: list[float | DeviceValue] = []
        for group in self.optimizer.param_groups:
            lr = group.get("lr", float("nan"))
            if isinstance(lr, torch.Tensor):
                out.append(DeviceValue(lr))
            else:
                out.append(float(lr))
        return tuple(out)


def _finite(value: float) -> bool:
    return value - value == 0.0


__all__ = [
    "Hooks",
    "LogRecord",
    "NonFiniteError",
    "batch_size",
    "optimizer_parameters",
    "output_loss",
]
