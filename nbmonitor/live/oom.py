"""An out-of-memory error that escapes a notebook cell: what it was, and undoing what it holds.

In a notebook an OOM is worse than anywhere else: the stored traceback (``sys.last_traceback``
and friends, IPython's own reference, the exception's frames) keeps the failed step's tensors
alive, so every later cell runs out of memory too. When a monitor is attached in a kernel,
``watch()`` registers one IPython ``post_run_cell`` callback (beside any others: IPython calls
them all); after a cell whose error is an OOM it builds an ``OomReport`` (plain data: what was
being allocated, where, the breakdown, the last peaks, the largest live tensors, advice) and
shows it under the cell. It runs on the main thread after the cell, never in the training
loop, and keeps no reference to the exception. ``free_oom()`` drops those references,
collects, empties the allocator's cache and says how much came back.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import torch

from nbmonitor._capture.memory_breakdown import storage_of
from nbmonitor._engine.run_model import RunModel
from nbmonitor.backends.alloc_conf import alloc_conf
from nbmonitor.memory import Freed, LiveTensor, MemoryBreakdown, OomReport, fmt_bytes

MAX_MESSAGE = 400
MAX_TENSORS = 8
PEAK_SAMPLES = 10

_TRIED = re.compile(
    r"[Tt]ried to allocate (?:(\d+) bytes|([\d.]+) ?(B|KiB|MiB|GiB|TiB))", re.IGNORECASE
)
_UNITS = {"B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _cuda_up() -> bool:
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def oom_kind(exc: BaseException) -> str | None:
    """``"cuda"``, ``"mps"``, ``"cpu"`` for an out-of-memory error, else None."""
    text = str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "CUDA out of memory" in text:
        return "cuda"
    if isinstance(exc, RuntimeError) and "MPS backend out of memory" in text:
        return "mps"
    if isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError)
        and ("DefaultCPUAllocator" in text or "can't allocate memory" in text)
    ):
        return "cpu"
    return None


def requested_bytes(message: str) -> float:
    """The allocation that failed, from torch's message ("Tried to allocate 2.00 GiB")."""
    found = _TRIED.search(message)
    if found is None:
        return math.nan
    if found.group(1):
        return float(found.group(1))
    return float(found.group(2)) * _UNITS[found.group(3).upper()]


def _frames(tb: TracebackType | None) -> Iterator[TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def where(
    tb: TracebackType | None, names: dict[int, str]
) -> tuple[str | None, str | None, list[tuple[str, str, Any]]]:
    """The innermost module of the model whose forward was running, the phase, and the
    tensors the traceback's frames hold as (variable, place, tensor)."""
    module = phase = None
    held: list[tuple[str, str, Any]] = []
    for frame_tb in _frames(tb):
        frame = frame_tb.tb_frame
        code = frame.f_code
        filename = code.co_filename.replace("\\", "/")
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module) and id(owner) in names:
            module, phase = names[id(owner)] or "(root)", "forward"
        elif "torch/autograd" in filename or code.co_name == "_engine_run_backward":
            phase = "backward"
        elif "torch/optim" in filename:
            phase = "optimizer step"
        place = code.co_qualname if hasattr(code, "co_qualname") else code.co_name
        if isinstance(owner, torch.nn.Module) and names.get(id(owner)):
            place += f" ({names[id(owner)]})"  # the model itself: its class names it
        for var, value in frame.f_locals.items():
            if isinstance(value, torch.Tensor):
                held.append((var, place, value))
    return module, phase, held


def storage_labels(model: torch.nn.Module | None, optimizer: Any) -> dict[Any, str]:
    """What holds each storage of the model's: ``"parameter 0.weight"``, ``"gradient of ..."``,
    ``"optimizer exp_avg of ..."``, ``"buffer ..."`` (by ``storage_of`` key)."""
    labels: dict[Any, str] = {}
    if model is None:
        return labels
    for name, p in model.named_parameters():
        labels.setdefault(storage_of(p)[0], f"parameter {name}")
        if p.grad is not None:
            labels.setdefault(storage_of(p.grad)[0], f"gradient of {name}")
        if optimizer is not None:
            state = optimizer.state.get(p)
            if isinstance(state, dict):
                for key, value in state.items():
                    if isinstance(value, torch.Tensor):
                        labels.setdefault(storage_of(value)[0], f"optimizer {key} of {name}")
    for name, b in model.named_buffers():
        labels.setdefault(storage_of(b)[0], f"buffer {name}")
    return labels


def largest_tensors(
    held: list[tuple[str, str, Any]], labels: dict[Any, str], scan: bool = True
) -> tuple[LiveTensor, ...]:
    """The largest live tensors (each storage once): those the traceback holds, named by
    variable and place, and (``scan``) every tensor the garbage collector tracks."""
    found: dict[Any, LiveTensor] = {}

    def add(t: torch.Tensor, what: str | None) -> None:
        key, nbytes = storage_of(t)
        if key in found:
            return
        label = labels.get(key) or what or "not held by the model or the traceback"
        found[key] = LiveTensor(
            nbytes, tuple(t.shape), str(t.dtype).removeprefix("torch."), str(t.device), label
        )

    for var, place, t in held:
        add(t, f"local `{var}` in {place}")
    if scan:
        for obj in gc.get_objects():
            # type(), not isinstance(): isinstance falls back to ``obj.__class__``, which some
            # objects answer with a warning (torch.distributed.reduce_op, deprecated) or code.
            if issubclass(type(obj), torch.Tensor):
                add(obj, None)
    return tuple(sorted(found.values(), key=lambda t: -t.nbytes)[:MAX_TENSORS])


def advice(
    kind: str,
    phase: str | None,
    breakdown: MemoryBreakdown | None,
    figures: dict[str, float],
    expandable: bool,
) -> tuple[str, ...]:
    out: list[str] = []
    batch, fits = figures.get("batch_size", math.nan), figures.get("batch_fits", math.nan)
    if math.isfinite(batch) and math.isfinite(fits) and fits < batch:
        out.append(
            f"A batch of about {max(1, int(fits))} (now {batch:.0f}) would have fit, by the "
            "last steps' peak; or keep the batch and accumulate gradients over micro-batches."
        )
    if breakdown is not None:
        total = breakdown.total_bytes
        act = breakdown.bytes("activations")
        if total and act >= 0.25 * total:
            out.append(
                f"Activations saved for backward are {fmt_bytes(act)} of {fmt_bytes(total)}: "
                "gradient checkpointing (torch.utils.checkpoint, or "
                "model.gradient_checkpointing_enable() in transformers) recomputes them in "
                "backward instead of keeping them."
            )
        fp32 = sum(
            r.bytes for r in breakdown.rows if r.category == "parameters" and r.dtype == "float32"
        )
        if kind != "cpu" and fp32 and fp32 >= 0.5 * breakdown.bytes("parameters"):
            out.append(
                "Mixed precision: torch.autocast(device_type='cuda', dtype=torch.bfloat16) about "
                "halves the activations; bf16 weights halve parameters and gradients too."
            )
        if phase == "forward" and breakdown.bytes("gradients"):
            out.append(
                f"{fmt_bytes(breakdown.bytes('gradients'))} of gradients are still allocated "
                "during the forward: optimizer.zero_grad(set_to_none=True) frees them between "
                "steps."
            )
    reserved, allocated = figures.get("reserved", math.nan), figures.get("allocated", math.nan)
    if kind == "cuda" and not expandable and reserved - allocated > 0.1 * reserved:
        out.append(
            f"{fmt_bytes(reserved - allocated)} was reserved but not in tensors (fragmentation): "
            "start the process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
        )
    out.append(
        "mon.free_oom() (or the button) releases what this error still holds, so the next "
        "cell runs without restarting the kernel."
    )
    return tuple(out)


def build_report(
    exc: BaseException,
    kind: str,
    *,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    run: RunModel,
    breakdown: MemoryBreakdown | None,
    step: int,
    device_index: int | None,
    scan: bool = True,
) -> OomReport:
    """Everything the card says, read now (after the cell); the exception is not kept."""
    names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
    module, phase, held = where(exc.__traceback__, names)
    text = str(exc).strip()
    message = text.splitlines()[0] if text else type(exc).__name__
    figures: dict[str, float] = {}
    with contextlib.suppress(Exception):  # the card must come whatever fails here
        figures.update(run.derived())
    if kind == "cuda" and _cuda_up():
        index = device_index or 0
        figures["reserved"] = float(torch.cuda.memory_reserved(index))
        figures["allocated"] = float(torch.cuda.memory_allocated(index))
    peak_key = "cuda_interval_peak_bytes" if kind == "cuda" else "process_rss_bytes"
    peaks: tuple[tuple[int, float], ...] = ()
    if peak_key in run.system.columns and "step" in run.system.columns:
        steps = run.system.tail("step", PEAK_SAMPLES).tolist()
        values = run.system.tail(peak_key, PEAK_SAMPLES).tolist()
        peaks = tuple((int(s), v) for s, v in zip(steps, values, strict=True) if v == v)
    expandable = bool(alloc_conf()["expandable_segments"])
    return OomReport(
        kind=kind,
        message=message[:MAX_MESSAGE],
        requested_bytes=requested_bytes(message),
        module=module,
        phase=phase,
        step=step,
        breakdown=breakdown,
        peaks=peaks,
        peak_key=peak_key,
        tensors=largest_tensors(held, storage_labels(model, optimizer), scan=scan),
        advice=advice(kind, phase, breakdown, figures, expandable),
        figures=figures,
    )


# -- freeing what the error holds -----------------------------------------------------------


def _measure(cuda_index: int | None) -> tuple[str, float]:
    if cuda_index is not None and _cuda_up():
        return "CUDA memory allocated", float(torch.cuda.memory_allocated(cuda_index))
    import psutil

    return "resident memory (RSS)", float(psutil.Process().memory_info().rss)


def _clear(exc: BaseException | None, seen: set[int]) -> None:
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)
            exc.__traceback__ = None
        _clear(exc.__cause__, seen)
        exc = exc.__context__


def free_oom(shell: Any, cuda_index: int | None) -> Freed:
    """Drop every reference the last error keeps (``sys.last_*``, IPython's last result, its
    traceback printer's and its output history ``Out``/``_oh``/``_``/``__``/``___``), clear
    the exception's frames, collect, and empty the allocator's cache."""
    what, before = _measure(cuda_index)
    released: list[str] = []
    errors: list[BaseException] = []
    for name in ("last_value", "last_exc"):
        value = getattr(sys, name, None)
        if isinstance(value, BaseException):
            errors.append(value)
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if getattr(sys, name, None) is not None:
            setattr(sys, name, None)
            released.append(f"sys.{name}")
    if shell is not None:
        result: Any = getattr(shell, "last_execution_result", None)
        error = getattr(result, "error_in_exec", None)
        if isinstance(error, BaseException):
            errors.append(error)
            result.error_in_exec = None
            released.append("IPython's last result")
        printer: Any = getattr(shell, "InteractiveTB", None)
        if getattr(printer, "tb", None) is not None:
            printer.tb = None
            released.append("IPython's traceback printer")
        hook = getattr(shell, "displayhook", None)
        if hook is not None and getattr(hook, "do_full_cache", False):
            hook.flush()  # Out, _oh, _, __, ___ (as %reset out does)
            released.append("the output history (Out, _)")
    seen: set[int] = set()
    for error in errors:
        _clear(error, seen)
    if errors:
        released.append("the error's frames")
    del errors
    gc.collect()
    if cuda_index is not None and _cuda_up():
        torch.cuda.empty_cache()
    elif torch.backends.mps.is_available():
        torch.mps.empty_cache()
    _, after = _measure(cuda_index)
    return Freed(what, before, after, tuple(released))


# -- the IPython callback --------------------------------------------------------------------

# Per kernel: the callback registered once, and what it reports on (the newest monitor's).
_REPORT: Callable[[BaseException], OomReport | None] | None = None
_REGISTERED: list[Callable[[Any], None]] = []


def watch(
    report: Callable[[BaseException], OomReport | None],
    show: Callable[[OomReport], None],
    failed: Callable[[Exception], None],
    shell: Any,
) -> None:
    """Show an OOM card under any cell whose error is an OOM. ``report`` builds it (from the
    newest attached monitor: it should hold that monitor weakly, and return None once it is
    gone), ``show`` displays it, ``failed`` hears of anything that went wrong. The IPython
    callback is registered once per kernel; a later call replaces what it reports on."""
    global _REPORT
    _REPORT = report

    def after_cell(result: Any) -> None:
        try:
            exc = getattr(result, "error_in_exec", None)
            make = _REPORT
            if not isinstance(exc, BaseException) or make is None:
                return
            if oom_kind(exc) is None:
                return
            card = make(exc)
            del exc
            if card is not None:
                show(card)
        except Exception as failure:  # never into IPython
            with contextlib.suppress(Exception):
                failed(failure)

    if not _REGISTERED:
        shell.events.register("post_run_cell", after_cell)
        _REGISTERED.append(after_cell)
