"""The attach options, declared once, and their checks: one-line errors that say what to do,
raised at the call before anything starts.

``AttachOptions`` is the typed keyword set of ``attach()`` and ``Monitor()``; ``Options`` holds
the resolved values with their defaults. A test keeps the two in step.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from nbmonitor._engine.assemble.layers import GROUPINGS
from nbmonitor.export import exporters
from nbmonitor.health import Thresholds
from nbmonitor.sinks.exporter import Exporter

if TYPE_CHECKING:
    import torch

ON_NAN = ("warn", "raise")
BACKENDS = ("auto", "cpu", "mps", "cuda")
# Parameter norms and update ratios are measured every this many steps by default: a copy of
# the parameters across optimizer.step() is the costly part (benchmarks/NOTES.md,
# "What the overhead is made of").
DEFAULT_LAYER_EVERY = 100
# A run folder is "<YYYYmmdd-HHMMSS>-<name>[-N]": 255 bytes (the usual file-name limit) less
# the timestamp and a suffix.
MAX_NAME_BYTES = 200


class AttachOptions(TypedDict, total=False):
    """The keyword options of ``nbmonitor.attach`` and ``nbmonitor.Monitor``:

    interval: seconds between system samples and run-log flushes.
    total_steps: the planned number of steps, for progress and ETA (counted from 0, also
        with ``start_step``).
    run_dir: the folder under which this run's directory ``<timestamp>-<name>/`` is created
        (made if missing).
    name: a name for the run (None: the model's class name).
    backend: ``"auto"`` (from where the model's parameters live), ``"cpu"``, ``"cuda"`` or
        ``"mps"``.
    display: in a notebook, show the dashboard under the cell; in a script, print a status
        line every few seconds. False shows and prints nothing, not even a closing line
        (call ``mon.dashboard()`` later).
    layer_every: measure parameter norms and update ratios (||dw|| / ||w||) every this
        many steps, and early on more often: each of the first 8 steps, then 4 times each
        time the step count doubles up to step 100 (10, 12, 14, 16, 20, 24, ..., 96; 0:
        never). Per-layer gradient norms are measured every step.
    layer_group: a layer is a parameter (``"param"``) or a module (``"module"``).
    activations: record activation statistics of leaf modules on the ``layer_every``
        schedule (mean, std, max |x|, fraction of zeros) and report dead units.
    check_forward: check every module's output for NaN/Inf, to name the first module
        that produced one (costs a few small kernels per module per forward).
    on_nan: ``"warn"`` reports non-finite gradients in the alerts; ``"raise"`` raises
        ``nbmonitor.NonFiniteError`` from ``optimizer.step()`` before the bad update is
        applied (this checks on the host every step, so it synchronises on CUDA).
    thresholds: health-rule thresholds, as ``nbmonitor.Thresholds`` or a dict of some of its
        fields (None: the defaults).
    start_step: the optimizer steps already done before this run (resuming from a
        checkpoint, e.g. nanoGPT's ``iter_num``): the first step recorded is
        ``start_step + 1``.
    phases: time each step's phases as columns ``phase_data_s`` (the wait for data: from the
        previous step's end, or a micro-batch's backward, to the next forward),
        ``phase_forward_s``, ``phase_backward_s``, ``phase_other_s`` (between backward and
        the optimizer: clipping, unscaling) and ``phase_optimizer_s``; they sum to
        ``step_time``. On a GPU one step in 16 (steps 16, 32, ...) is timed with CUDA events
        (the device's time, read later, never a sync) and the others on the host clock (the
        time their work took to queue), so that a step pays no event; elsewhere the host
        clock.
    flops: count the model's FLOPs once, in the first training forward
        (``torch.utils.flop_counter.FlopCounterMode``; that one forward runs slower), for
        TFLOP/s and MFU (docs/throughput.md).
    display_rank: in a distributed job (``torchrun``), the rank that shows the dashboard or
        status lines, follows the other ranks for the job alerts (straggler, same batches,
        ranks out of sync, a stalled rank or job) and writes ``ranks_summary.json`` at close;
        the others record silently.
    memory_history: on CUDA, record the allocator's history (every allocation and free,
        with its stack; ``torch.cuda.memory._record_memory_history``) so that
        ``mon.memory_snapshot(path)`` writes a file for https://pytorch.org/memory_viz and an
        out-of-memory card links the snapshot taken at the failure. It costs: stacks are
        captured at every allocation.
    export: hand the run on as it is recorded: ``"tensorboard"``, ``"wandb"``,
        ``"mlflow"``, ``"trackio"``, ``"prometheus"``, ``"parquet"``, ``"csv"``, an exporter
        object with options (``nbmonitor.export.TensorBoard(log_dir=...)``), or a list of
        them. One that cannot start or fails is reported in ``errors``; the run goes on.
    scheduler: the learning-rate scheduler the loop steps, if any: ``mon.checkpoint()``
        saves its state too, and ``mon.set_lr()`` scales its ``base_lrs`` with the new
        learning rate (docs/steering.md).
    on_checkpoint: called as ``on_checkpoint(path, step)`` on the training thread, at the
        end of a step, when a checkpoint is asked for (``mon.checkpoint()``, the dashboard,
        ``nbmonitor ctl``), instead of nbmonitor's own save to ``path``.

    """

    interval: float
    total_steps: int | None
    run_dir: str | os.PathLike[str]
    name: str | None
    backend: str
    display: bool
    layer_every: int
    layer_group: str
    activations: bool
    check_forward: bool
    on_nan: str
    thresholds: Thresholds | Mapping[str, float] | None
    start_step: int
    phases: bool
    flops: bool
    display_rank: int
    memory_history: bool
    export: str | Exporter | Sequence[str | Exporter] | None
    scheduler: Any
    on_checkpoint: Callable[[Path, int], object] | None


@dataclasses.dataclass(frozen=True)
class Options:
    """The resolved attach options (defaults here)."""

    interval: float = 0.5
    total_steps: int | None = None
    run_dir: str | os.PathLike[str] = "runs"
    name: str | None = None
    backend: str = "auto"
    display: bool = True
    layer_every: int = DEFAULT_LAYER_EVERY
    layer_group: str = "param"
    activations: bool = False
    check_forward: bool = False
    on_nan: str = "warn"
    thresholds: Thresholds = dataclasses.field(default_factory=Thresholds)
    start_step: int = 0
    phases: bool = True
    flops: bool = True
    display_rank: int = 0
    memory_history: bool = False
    export: tuple[Exporter, ...] = ()
    scheduler: Any = None
    on_checkpoint: Callable[[Path, int], object] | None = None

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> Options:
        """Check and resolve ``attach()`` keywords; raises TypeError/ValueError in one line."""
        known = [f.name for f in dataclasses.fields(cls)]
        for key in kwargs:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}."
                raise TypeError(f"nbmonitor.attach: unknown option {key!r}{hint}")
        values = dict(kwargs)
        values["thresholds"] = coerce_thresholds(values.get("thresholds"))
        values["export"] = tuple(exporters(values.get("export")))
        options = cls(**values)
        check_options(options)
        return options

    def as_meta(self) -> dict[str, object]:
        """The options as written to the run's meta.json."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["run_dir"] = str(self.run_dir)
        out["thresholds"] = dataclasses.asdict(self.thresholds)
        out["export"] = [e.name for e in self.export]  # their options may hold credentials
        out["scheduler"] = type(self.scheduler).__name__ if self.scheduler is not None else None
        out["on_checkpoint"] = self.on_checkpoint is not None
        return out


class WrappedOptimizer(Protocol):
    """A framework's optimizer wrapper (Accelerate's ``AcceleratedOptimizer``, Lightning's
    ``LightningOptimizer``): the torch optimizer that steps is its ``.optimizer``."""

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...


def check_model(model: object, optimizer: object) -> torch.optim.Optimizer | None:
    """The model and optimizer ``attach()`` was given; returns the torch optimizer, taken out
    of a framework's wrapper (its ``.optimizer``), whose ``step()`` is the one that runs."""
    import torch

    inner = getattr(optimizer, "optimizer", None)
    if inner is not optimizer and isinstance(inner, torch.optim.Optimizer):
        optimizer = inner

    from nbmonitor._capture.inputs import optimizer_parameters

    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"nbmonitor.attach: model must be a torch.nn.Module, got {type(model).__name__}; "
            "call attach(model, optimizer)."
        )
    if any(p.is_meta for p in model.parameters()):
        raise ValueError(
            "nbmonitor.attach: the model has parameters on the meta device (no values to "
            "measure); materialise it first, e.g. model.to_empty(device='cpu') and load weights."
        )
    if optimizer is not None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                "nbmonitor.attach: optimizer must be a torch.optim.Optimizer (or a wrapper with "
                f"one as .optimizer) or None, got {type(optimizer).__name__}; pass the "
                "optimizer you call .step() on."
            )
        model_params = {id(p) for p in model.parameters()}
        if not model_params and optimizer_parameters(optimizer):
            raise ValueError(
                f"nbmonitor.attach: the model ({type(model).__name__}) has no parameters, so "
                "the optimizer's belong to another model; attach the model it trains."
            )
        if model_params and not any(id(p) in model_params for p in optimizer_parameters(optimizer)):
            raise ValueError(
                "nbmonitor.attach: the optimizer holds none of the model's parameters; "
                "build it from model.parameters() or pass the matching model."
            )
    return optimizer


def check_options(options: Options) -> None:
    interval, total_steps, name = options.interval, options.total_steps, options.name
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or not math.isfinite(interval)
        or interval <= 0
    ):
        raise ValueError(
            f"nbmonitor.attach: interval must be a number of seconds > 0, got {interval!r}; "
            "e.g. interval=0.5."
        )
    if total_steps is not None and (
        isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0
    ):
        raise ValueError(
            f"nbmonitor.attach: total_steps must be a positive int or None, got {total_steps!r}."
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"nbmonitor.attach: name must be a str or None, got {type(name).__name__}.")
    if name is not None and ("\0" in name or len(name.encode()) > MAX_NAME_BYTES):
        raise ValueError(
            f"nbmonitor.attach: name must be at most {MAX_NAME_BYTES} bytes without NUL (it "
            f"names the run folder), got {len(name.encode())} bytes; pass a shorter name=."
        )
    check_run_dir(options.run_dir)
    for flag in ("display", "activations", "check_forward", "phases", "flops", "memory_history"):
        value = getattr(options, flag)
        if not isinstance(value, bool):
            raise TypeError(f"nbmonitor.attach: {flag} must be True or False, got {value!r}.")
    if options.backend not in BACKENDS:
        raise ValueError(
            f"nbmonitor: unknown backend {options.backend!r}; use one of {', '.join(BACKENDS)}."
        )
    layer_every, layer_group, on_nan = options.layer_every, options.layer_group, options.on_nan
    if isinstance(layer_every, bool) or not isinstance(layer_every, int) or layer_every < 0:
        raise ValueError(
            f"nbmonitor.attach: layer_every must be an int >= 0 (0 turns parameter norms and "
            f"update ratios off), got {layer_every!r}."
        )
    if layer_group not in GROUPINGS:
        raise ValueError(
            f"nbmonitor.attach: layer_group must be 'param' or 'module', got {layer_group!r}."
        )
    start_step = options.start_step
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ValueError(
            f"nbmonitor.attach: start_step must be an int >= 0 (the steps done before, e.g. "
            f"the checkpoint's iteration), got {start_step!r}."
        )
    display_rank = options.display_rank
    if isinstance(display_rank, bool) or not isinstance(display_rank, int) or display_rank < 0:
        raise ValueError(
            f"nbmonitor.attach: display_rank must be an int >= 0 (the rank that shows the "
            f"dashboard), got {display_rank!r}."
        )
    if on_nan not in ON_NAN:
        raise ValueError(f"nbmonitor.attach: on_nan must be 'warn' or 'raise', got {on_nan!r}.")
    check_steering(options.scheduler, options.on_checkpoint)


def check_steering(scheduler: object, on_checkpoint: object) -> None:
    """A scheduler with what steering uses of it, and a callable ``on_checkpoint``."""
    if scheduler is not None:
        missing = [
            name
            for name in ("state_dict", "base_lrs")
            if not hasattr(scheduler, name)  # a torch LRScheduler has both
        ]
        if missing:
            raise TypeError(
                "nbmonitor.attach: scheduler must be an lr scheduler (e.g. "
                f"torch.optim.lr_scheduler.CosineAnnealingLR), got {type(scheduler).__name__} "
                f"without {' or '.join(missing)}."
            )
    if on_checkpoint is not None and not callable(on_checkpoint):
        raise TypeError(
            "nbmonitor.attach: on_checkpoint must be a callable on_checkpoint(path, step) or "
            f"None, got {type(on_checkpoint).__name__}."
        )


def check_run_dir(run_dir: object) -> None:
    """A folder name, and not a file: caught here rather than as pathlib's error later."""
    if not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError(
            "nbmonitor.attach: run_dir must be a str or os.PathLike, got "
            f"{type(run_dir).__name__}; e.g. run_dir='runs'."
        )
    text = os.fspath(run_dir)
    if not isinstance(text, str) or not text or "\0" in text:
        raise ValueError(
            f"nbmonitor.attach: run_dir {text!r} is not a folder name (empty, bytes or with "
            "NUL); e.g. run_dir='runs'."
        )
    if os.path.isfile(text):
        raise ValueError(
            f"nbmonitor.attach: run_dir {text!r} is a file; pass a folder (made if missing)."
        )


def coerce_thresholds(value: object) -> Thresholds:
    if value is None:
        return Thresholds()
    if isinstance(value, Thresholds):
        return value
    if isinstance(value, Mapping):
        try:
            return Thresholds(**value)
        except TypeError as exc:
            known = ", ".join(f.name for f in dataclasses.fields(Thresholds))
            raise ValueError(
                f"nbmonitor.attach: unknown thresholds field in {sorted(value)}; known: {known}."
            ) from exc
    raise TypeError(
        "nbmonitor.attach: thresholds must be a dict or nbmonitor.Thresholds, got "
        f"{type(value).__name__}."
    )
