"""Where each microsecond of watching goes: a per-step breakdown of what nbmonitor runs on the
training thread, what it adds to the step in torch calls, records and hooks (counted), what a
sampler tick costs by stage, and what ``close()`` costs by part.

    python -m benchmarks.cost                          # tiny, no view (display=False)
    python -m benchmarks.cost --task mlp20 --dashboard --steps 2000
    python -m benchmarks.cost --parts paired --attach check_forward=True   # an optional probe
    python -m benchmarks.cost --task mlp20 --device cuda   # on a GPU: events and copies too
    python -m benchmarks.cost --parts floor --attach interval=3600   # the floor, no ticks

Five parts (four by default), each on a fresh monitor of the same model (AdamW,
``mon.log(loss=loss)`` every step, defaults otherwise), timed after ``--warmup`` steps so
that the layer sampling of the first 100 steps is left out:

1. **Paired fixed cost**: a plain twin and a monitored twin stepped in turn (as
   ``paired.py``), the median of the per-pair difference with a 95 % bootstrap interval. This
   is the number; the rest says what it is made of.
1b. **The floor** (``--parts floor``, not run by default): five twins in turn, the plain
   loop, plus the gradient-norm pass, plus the same hooks registered empty, plus those hooks
   doing the least Python can for the default features (``_Skeleton``), and monitored, in
   the thread's CPU time: nbmonitor's own fixed cost apart from the fused norm and torch's
   hook dispatch, against that floor (``floor()``).
2. **Per-step breakdown**: every hook, probe and listener of the training thread wrapped in a
   timer (class attributes patched before attach); inclusive microseconds per step, nested as
   they call each other. The timers add ~0.2 us per call of their own.
3. **Counts per step**: torch operators dispatched (a ``TorchDispatchMode``, monitored minus
   plain: on a GPU each one is a kernel launch or a copy, ~5-10 us of host time), records put,
   hooks installed. Stable on any machine: what the counted test
   (``tests/capture/test_cost_counted.py``) holds down.
4. **Sampler and close**: each tick by stage (wall and the sampler thread's CPU, median and
   p99), the CPU of the run-log and view workers (they hold the GIL too) from one tick's start
   to the next, the steps a tick overlapped against the others, and ``close()`` by part.

On a shared machine every time is taken under load: read the paired interval, not the point.
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbmonitor
from nbmonitor._capture import clock as _clock
from nbmonitor._capture import intercept, phases
from nbmonitor._capture.probes import grad_norms, memory, update_ratio
from nbmonitor._engine import isolated, sampler, session
from overhead import BOOTSTRAP_RESAMPLES, environment, make_task, train_step

# What the training thread runs, as (owner, attribute, label); nested by call, outermost first.
TRAINING_PARTS: tuple[tuple[Any, str, str], ...] = (
    (_clock.StepClock, "_forward_pre", "forward pre-hook"),
    (_clock.StepClock, "_forward", "forward hook"),
    (_clock.StepClock, "backward_called", "backward() listener"),
    (phases.PhaseTimer, "_param_landed", "backward end (last gradient's hook)"),
    (_clock.StepClock, "_step_pre", "optimizer pre-step hook"),
    (grad_norms.GradNormProbe, "pre_step", "  gradient norms"),
    (memory.MemoryProbe, "pre_step", "  memory probe (pre)"),
    (update_ratio.UpdateRatioProbe, "pre_step", "  update ratio (pre)"),
    (_clock.StepClock, "_step_post", "optimizer post-step hook"),
    (memory.MemoryProbe, "post_step", "  memory probe (post)"),
    (update_ratio.UpdateRatioProbe, "post_step", "  update ratio (post)"),
    (_clock.StepClock, "_end_step", "  step end (record)"),
    (phases.PhaseTimer, "step_end", "    phases record"),
    (phases.PhaseTimer, "mark", "phase marks (all)"),
    (nbmonitor.Monitor, "log", "mon.log(loss=loss)"),
)


WRAPPER = "backward() wrapper (less torch's backward)"


class Timers:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.on = False

    def wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1

        return timed


@contextmanager
def patched(parts: tuple[tuple[Any, str, str], ...], timers: Timers) -> Iterator[None]:
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in parts]
    try:
        for owner, name, label in parts:
            setattr(owner, name, timers.wrap(getattr(owner, name), label))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


# attach() options of this run (--attach key=value): the cost of an optional probe.
OPTIONS: dict[str, Any] = {}


def attach(model: torch.nn.Module, opt: torch.optim.Optimizer, tmp: str, dashboard: bool) -> Any:
    mon = nbmonitor.attach(model, opt, run_dir=tmp, display=False, **OPTIONS)
    if dashboard:
        mon.dashboard()  # what a notebook shows, without a front end
    return mon


def paired(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """Plain and monitored twins stepped in turn; the monitored one's excess per step."""
    twins = [make_task(args.task, args.device) for _ in range(2)]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m, _ in twins]
    cuda = args.device == "cuda"
    diffs: list[float] = []
    for half in range(2):  # the twins swap roles halfway (paired.py: twins do not run alike)
        watched = half
        mon = attach(twins[watched][0], opts[watched], tmp, args.dashboard)
        for _ in range(args.warmup):
            for i in (0, 1):
                train_step(twins[i][0], twins[i][1], opts[i], mon if i == watched else None)
        times: dict[int, list[float]] = {0: [], 1: []}
        for pair in range(args.pairs // 2):
            for i in (0, 1) if pair % 2 == 0 else (1, 0):
                t0 = time.perf_counter()
                train_step(twins[i][0], twins[i][1], opts[i], mon if i == watched else None)
                if cuda:
                    torch.cuda.synchronize()
                times[i].append(time.perf_counter() - t0)
        mon.close()
        diffs += [a - b for a, b in zip(times[watched], times[1 - watched], strict=True)]
        plain = statistics.median(times[1 - watched])
    d = np.asarray(diffs)
    rows = np.random.default_rng(0).integers(0, len(d), size=(BOOTSTRAP_RESAMPLES, len(d)))
    lo, hi = np.quantile(np.median(d[rows], axis=1), [0.025, 0.975])
    return {
        "pairs": len(d),
        "plain_step_us": plain * 1e6,
        "added_us": float(np.median(d)) * 1e6,
        "added_us_ci95": [lo * 1e6, hi * 1e6],
    }


# The floor's twins, each one step further from the plain loop (see floor()).
FLOOR_ROLES = ("plain", "norm", "hooks", "skeleton", "monitored")


def _empty_hooks(
    model: torch.nn.Module, opt: torch.optim.Optimizer, norm: grad_norms.NormPass
) -> list[Any]:
    """The hooks nbmonitor registers at defaults, each doing nothing (the pre-step one takes the
    norm): what torch's hook dispatch costs (``_call_impl``'s slow path, a gradient's
    post-accumulate hook, the optimizer's hook lists) before nbmonitor does any work."""

    def forward_pre(module: torch.nn.Module, args: Any) -> None:
        return None

    def forward(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        return None

    def landed(param: torch.Tensor) -> None:
        return None

    def pre_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        norm.take()

    def post_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        return None

    last = list(model.parameters())[-1]
    return [
        model.register_forward_pre_hook(forward_pre),
        model.register_forward_hook(forward, with_kwargs=True),
        last.register_post_accumulate_grad_hook(landed),
        opt.register_step_pre_hook(pre_step),
        opt.register_step_post_hook(post_step),
    ]


class _Skeleton:
    """The least that hooks in Python can do for what nbmonitor shows at defaults, written as
    plainly as it can be, with no guard, no probe and no sampler: a clock read at each of the
    five moments of a step summed into its phase, the batch size (and tokens) of each forward
    from its first argument, a reference to the loss, the norm, and one tuple a step (and one
    for the logged loss) on a deque. ``skeleton - hooks`` is what those features cost in
    Python over torch's own dispatch of the same hooks: a floor for nbmonitor's own work."""

    def __init__(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer, norm: grad_norms.NormPass
    ) -> None:
        self.records: collections.deque[tuple[Any, ...]] = collections.deque()
        self.sums = [0.0] * 5
        self.last = time.perf_counter()
        self.step = 0
        self.samples = self.tokens = self.micro = 0
        self.start = self.last
        self.loss: Any = None
        self.norms: Any = None
        clock, sums = time.perf_counter, self.sums

        def mark(phase: int) -> float:
            now = clock()
            sums[phase] += now - self.last
            self.last = now
            return now

        def forward_pre(module: torch.nn.Module, args: Any) -> None:
            if torch.is_grad_enabled():
                mark(0)

        def forward(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if not torch.is_grad_enabled():
                return
            mark(1)
            first = args[0] if args else None
            if isinstance(first, torch.Tensor) and first.shape:
                self.samples += first.shape[0]
                if first.dim() == 2 and first.dtype in (torch.int64, torch.int32):
                    self.tokens += first.numel()
            self.micro += 1

        def landed(param: torch.Tensor) -> None:
            mark(2)

        def pre_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            mark(3)
            self.norms = norm.take()

        def post_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            now = mark(4)
            self.step += 1
            self.records.append(
                (
                    self.step,
                    now - self.start,
                    self.samples,
                    self.tokens,
                    self.micro,
                    optimizer.param_groups[0]["lr"],
                    self.norms,
                    tuple(sums),
                )
            )
            self.start = now
            self.samples = self.tokens = self.micro = 0
            sums[:] = (0.0,) * 5
            if len(self.records) > 4096:
                self.records.clear()

        last = list(model.parameters())[-1]
        self.handles = [
            model.register_forward_pre_hook(forward_pre),
            model.register_forward_hook(forward, with_kwargs=True),
            last.register_post_accumulate_grad_hook(landed),
            opt.register_step_pre_hook(pre_step),
            opt.register_step_post_hook(post_step),
        ]

    def backward(self, loss: torch.Tensor) -> None:
        self.loss = loss  # the step's loss, read on another thread later
        intercept._ORIGINAL_BACKWARD(loss)

    def log(self, loss: torch.Tensor) -> None:
        self.records.append((self.step, "loss", loss))


def floor(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """What the fixed cost is measured against: five twins stepped in turn, in a new random
    order each pass, each role on each twin in turn (rounds), timed in the thread's CPU time
    (a wait for the GIL or a preempted core is not counted) and on the wall clock:

    - ``plain``: the loop alone (its backward past nbmonitor's wrapper of
      ``torch.autograd.backward``, which a monitor attached anywhere puts in every loop);
    - ``norm``: plus the per-parameter gradient norms nbmonitor takes (``NormPass.take``: on
      ``tiny`` one ``_foreach_norm`` and a ``stack``), before ``optimizer.step()``;
    - ``hooks``: plus the hooks nbmonitor registers at defaults, empty (the norm taken in the
      pre-step one): torch's own cost of a module, a gradient and an optimizer with hooks;
    - ``skeleton``: the same hooks doing the least Python can for the default features
      (``_Skeleton``);
    - ``monitored``: attached at defaults (``--attach`` options), ``mon.log(loss=loss)``.

    ``monitored - hooks`` is nbmonitor's own fixed cost on the training thread: issue 29's
    "15 us plus the fused norm" is ``monitored - norm``."""
    rng = np.random.default_rng(1)
    twins = [make_task(args.task, args.device) for _ in FLOOR_ROLES]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m, _ in twins]
    norms = [grad_norms.NormPass(list(m.parameters())) for m, _ in twins]
    backward = intercept._ORIGINAL_BACKWARD
    cpu: dict[str, list[float]] = {role: [] for role in FLOOR_ROLES}
    wall: dict[str, list[float]] = {role: [] for role in FLOOR_ROLES}
    rounds = len(FLOOR_ROLES)
    for r in range(rounds):
        role_of = {(i + r) % len(twins): role for i, role in enumerate(FLOOR_ROLES)}
        mon: Any = None
        handles: list[Any] = []
        skeleton: Any = None
        for i, role in role_of.items():
            if role == "monitored":
                mon = attach(twins[i][0], opts[i], tmp, args.dashboard)
            elif role == "hooks":
                handles += _empty_hooks(twins[i][0], opts[i], norms[i])
            elif role == "skeleton":
                skeleton = _Skeleton(twins[i][0], opts[i], norms[i])
                handles += skeleton.handles

        def step(i: int, role: str, mon: Any, skeleton: Any = skeleton) -> None:
            model, loss_fn = twins[i]
            loss = loss_fn(model)
            if role == "monitored":
                # What Tensor.backward calls (nbmonitor's wrapper), without Tensor.backward's
                # own frame, which the other twins skip too.
                torch.autograd.backward(loss)
            elif role == "skeleton":
                skeleton.backward(loss)
            else:
                backward(loss)
                if role == "norm":
                    norms[i].take()
            opts[i].step()
            opts[i].zero_grad(set_to_none=True)
            if role == "monitored":
                mon.log(loss=loss)
            elif role == "skeleton":
                skeleton.log(loss=loss)

        for _ in range(args.warmup):
            for i, role in role_of.items():
                step(i, role, mon)
        order = list(role_of.items())
        for _ in range(args.pairs // rounds):
            for k in rng.permutation(len(order)):
                i, role = order[k]
                c0, t0 = time.thread_time(), time.perf_counter()
                step(i, role, mon)
                wall[role].append(time.perf_counter() - t0)
                cpu[role].append(time.thread_time() - c0)
        mon.close()
        for handle in handles:
            handle.remove()
    out: dict[str, Any] = {"passes": len(cpu["plain"])}
    for clock, times in (("cpu", cpu), ("wall", wall)):
        base = np.asarray(times["plain"])
        out[f"{clock}_plain_step_us"] = float(np.median(base)) * 1e6
        for a, b in itertools.pairwise(FLOOR_ROLES):
            out[f"{clock}_{b}_minus_{a}_us"] = _median_diff(times[b], times[a])
        out[f"{clock}_monitored_minus_norm_us"] = _median_diff(times["monitored"], times["norm"])
        out[f"{clock}_skeleton_minus_norm_us"] = _median_diff(times["skeleton"], times["norm"])
        out[f"{clock}_monitored_minus_hooks_us"] = _median_diff(times["monitored"], times["hooks"])
        out[f"{clock}_monitored_minus_plain_us"] = _median_diff(times["monitored"], base)
    return out


def _median_diff(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> list[float]:
    """The median of the per-pass differences (us) and its 95 % bootstrap interval."""
    d = (np.asarray(a) - np.asarray(b)) * 1e6
    rows = np.random.default_rng(0).integers(0, len(d), size=(BOOTSTRAP_RESAMPLES, len(d)))
    lo, hi = np.quantile(np.median(d[rows], axis=1), [0.025, 0.975])
    return [float(np.median(d)), float(lo), float(hi)]


def breakdown(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    model, loss_fn = make_task(args.task, args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    timers = Timers()
    # The wrapper's own cost is its time less torch's backward inside it.
    backward, original = intercept.backward, intercept._ORIGINAL_BACKWARD
    intercept.backward = timers.wrap(backward, WRAPPER)
    try:
        with patched(TRAINING_PARTS, timers):
            mon = attach(model, opt, tmp, args.dashboard)
            # Looked up by the wrapper at each call; put back before close compares it.
            intercept._ORIGINAL_BACKWARD = timers.wrap(original, "torch backward")
            for _ in range(args.warmup):
                train_step(model, loss_fn, opt, mon)
            timers.on = True
            for _ in range(args.steps):
                train_step(model, loss_fn, opt, mon)
            timers.on = False
            intercept._ORIGINAL_BACKWARD = original
            mon.close()
    finally:
        intercept.backward = backward
        intercept._ORIGINAL_BACKWARD = original
    timers.seconds[WRAPPER] -= timers.seconds.pop("torch backward")
    labels = [label for _, _, label in TRAINING_PARTS]
    labels.insert(2, WRAPPER)
    return {
        label: {
            "us_per_step": timers.seconds[label] / args.steps * 1e6,
            "calls_per_step": timers.calls[label] / args.steps,
        }
        for label in labels
    }


def counts(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    steps = 10
    ops: dict[str, collections.Counter[str]] = {}
    out: dict[str, Any] = {}
    for mode in ("plain", "monitored"):
        model, loss_fn = make_task(args.task, args.device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        mon = attach(model, opt, tmp, args.dashboard) if mode == "monitored" else None
        for _ in range(args.warmup):
            train_step(model, loss_fn, opt, mon)
        if mon is not None:
            mon.flush()
            recorder = mon._life.clock().recorder
            before = len(recorder)
        counter = CountOps()
        with counter:
            for _ in range(steps):
                train_step(model, loss_fn, opt, mon)
        ops[mode] = counter.ops
        if mon is not None:
            kinds = collections.Counter(type(r).__name__ for r in list(recorder._queue)[before:])
            out["records_per_step"] = {k: v / steps for k, v in kinds.items()}
            out["hooks"] = hook_counts(model, opt)
            mon.close()
    added = ops["monitored"] - ops["plain"]
    out["plain_ops_per_step"] = sum(ops["plain"].values()) / steps
    out["added_ops_per_step"] = sum(added.values()) / steps
    out["added_ops"] = {k: v / steps for k, v in added.most_common()}
    return out


def hook_counts(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    modules = list(model.modules())
    return {
        "module_forward_pre_hooks": sum(len(m._forward_pre_hooks) for m in modules),
        "module_forward_hooks": sum(len(m._forward_hooks) for m in modules),
        "module_backward_hooks": sum(len(m._backward_hooks) for m in modules),
        "parameter_hooks": sum(
            len(p._post_accumulate_grad_hooks or {}) + len(p._backward_hooks or {})
            for p in model.parameters()
        ),
        "optimizer_hooks": len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks),
    }


def ticks(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """Each scheduled tick by stage, and the steps it overlapped against the rest."""
    model, loss_fn = make_task(args.task, args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    stages: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    spans: list[tuple[float, float]] = []
    original = sampler.Stage.__call__

    # The run log and the view run on workers of their own, holding the GIL as the sampler
    # does: their CPU from one tick's start to the next is that tick's.
    workers: list[tuple[float, float, float]] = []
    tick_cpu: list[float] = []

    def worker_cpu() -> tuple[float, float, float]:
        sources = mon._pipeline.sources
        writer = writer_cpu_s(mon)  # another process: its own start is not a tick's
        return (
            float(sources.runlog.cpu_used),
            float(sources.view.cpu_used),
            math.nan if writer is None else writer,
        )

    def timed(self: sampler.Stage, paced: bool = False) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        original(self, paced)
        stages[self.name].append((time.perf_counter() - start, time.thread_time() - cpu))
        if self.name == "view":  # the last stage: the whole tick
            spans.append((tick_start.pop(), time.perf_counter()))
            tick_cpu.append(time.thread_time() - tick_thread_cpu.pop())

    tick_start: list[float] = []
    tick_thread_cpu: list[float] = []
    first = sampler.Stage.__call__

    def timed_first(self: sampler.Stage, paced: bool = False) -> None:
        if self.name == "sample":
            workers.append(worker_cpu())  # before the tick's own clocks start
            tick_start.append(time.perf_counter())
            tick_thread_cpu.append(time.thread_time())
        timed(self, paced)

    sampler.Stage.__call__ = timed_first  # type: ignore[method-assign]
    step_spans: list[tuple[float, float]] = []
    try:
        mon = attach(model, opt, tmp, args.dashboard)
        for _ in range(args.warmup):
            train_step(model, loss_fn, opt, mon)
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            train_step(model, loss_fn, opt, mon)
            step_spans.append((t0, time.perf_counter()))
        close = close_parts(mon)
    finally:
        sampler.Stage.__call__ = first  # type: ignore[method-assign]
    out: dict[str, Any] = {"steps": len(step_spans), "close": close}
    # The writer process's CPU between tick starts once it runs (/proc: 10 ms ticks, so the
    # median of many reads 0 or 10; the mean is the figure).
    writer = [(b[2] - a[2]) * 1e3 for a, b in itertools.pairwise(workers)]
    writer = [w for w in writer if math.isfinite(w)]
    if writer:
        out["writer_process_cpu_ms_per_tick"] = statistics.fmean(writer)
    for name, values in stages.items():
        wall = [w * 1e3 for w, _ in values]
        cpu = [c * 1e3 for _, c in values]
        out[f"stage_{name}"] = summary(wall, cpu)
    whole = [(e - s) * 1e3 for s, e in spans]
    out["tick"] = summary(whole, None)
    out["tick_cpu_ms"] = percentiles([c * 1e3 for c in tick_cpu]) if tick_cpu else {}
    # Worker CPU between consecutive tick starts: the tick before's run log and view work.
    runlog = [(b[0] - a[0]) * 1e3 for a, b in itertools.pairwise(workers)]
    view = [(b[1] - a[1]) * 1e3 for a, b in itertools.pairwise(workers)]
    spent = [r + v for r, v in zip(runlog, view, strict=True)]
    out["workers_cpu_ms"] = percentiles(spent) if spent else {}
    out["runlog_worker_cpu_ms"] = percentiles(runlog) if runlog else {}
    out["view_worker_cpu_ms"] = percentiles(view) if view else {}
    both = [c * 1e3 + w for c, w in zip(tick_cpu, spent, strict=False)]
    out["tick_all_cpu_ms"] = percentiles(both) if both else {}
    hit = [any(ts < e and te > s for ts, te in spans) for s, e in step_spans]
    on = [e - s for (s, e), h in zip(step_spans, hit, strict=True) if h]
    off = [e - s for (s, e), h in zip(step_spans, hit, strict=True) if not h]
    if on and off:
        out["step_us_overlapping_a_tick"] = percentiles([t * 1e6 for t in on])
        out["step_us_other"] = percentiles([t * 1e6 for t in off])
    return out


def writer_cpu_s(mon: Any) -> float | None:
    """The CPU the run log's writer process (another process: not the training process's
    GIL) has used so far, from /proc (Linux; None without one)."""
    for sink in getattr(mon._pipeline.parts.sinks, "sinks", []):
        writer = getattr(sink, "_writer", None)
        if writer is None:
            continue
        try:
            fields = Path(f"/proc/{writer.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def percentiles(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    return {
        "n": len(a),
        "median": float(np.median(a)),
        "p90": float(np.quantile(a, 0.9)),
        "p99": float(np.quantile(a, 0.99)),
        "max": float(a.max()),
    }


def summary(wall: list[float], cpu: list[float] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"wall_ms": percentiles(wall) if wall else {}}
    if cpu:
        out["cpu_ms"] = percentiles(cpu)
    return out


def close_parts(mon: Any) -> dict[str, float]:
    """``mon.close()`` timed by part (ms)."""
    parts: dict[str, float] = collections.defaultdict(float)
    patches = [
        (sampler.SamplerThread, "stop", "sampler thread stop"),
        (session.Session, "_final_tick", "final tick"),
        (session.Session, "_release", "sinks, backend and workers"),
        (isolated.Sources, "close", "  workers joined"),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]

    def wrap(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts[label] += (time.perf_counter() - start) * 1e3

        return timed

    join = isolated.Isolated.close

    def timed_join(self: isolated.Isolated, timeout: float) -> bool:
        # Which worker close waits for, and whether it was still in a call then (a source's
        # call in flight: a slow NVML init or read, a run log on a slow disk).
        busy = self.busy
        start = time.perf_counter()
        try:
            return join(self, timeout)
        finally:
            label = f"    join {self.name}{' (busy)' if busy else ''}"
            parts[label] += (time.perf_counter() - start) * 1e3

    for owner, name, label in patches:
        setattr(owner, name, wrap(getattr(owner, name), label))
    isolated.Isolated.close = timed_join  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        mon.close()
        parts["close (all)"] = (time.perf_counter() - start) * 1e3
    finally:
        isolated.Isolated.close = join  # type: ignore[method-assign]
        for owner, name, original in saved:
            setattr(owner, name, original)
    latency = getattr(mon.backend, "field_latency_us", None)
    if latency is not None:  # CUDA: NVML's init and each field's mean read time
        parts.update({f"nvml {k} (mean us)": v for k, v in latency().items()})
    return dict(parts)


def report(results: dict[str, Any]) -> None:
    print(
        f"{results['task']} on {results['device']}, view: {results['view']}, "
        f"attach options: {results['attach'] or 'defaults'}"
    )
    if "paired" in results:
        p = results["paired"]
        lo, hi = p["added_us_ci95"]
        print(
            f"plain step {p['plain_step_us']:.0f} us; monitored +{p['added_us']:.1f} us per "
            f"step (95 % CI {lo:+.1f} .. {hi:+.1f}, {p['pairs']} pairs)"
        )
    if "floor" in results:
        report_floor(results["floor"])
    if "breakdown" in results:
        print("\ntraining thread, inclusive us per step (calls per step):")
        for label, v in results["breakdown"].items():
            print(f"  {label:42s} {v['us_per_step']:8.2f}  ({v['calls_per_step']:.2f})")
    if "counts" in results:
        report_counts(results["counts"])
    if "sampler" in results:
        report_sampler(results["sampler"])


def report_floor(f: dict[str, Any]) -> None:
    print(f"\nfloor ({f['passes']} passes of five twins), median us per step [95 % CI]:")
    for clock in ("cpu", "wall"):
        print(f"  {clock}: plain step {f[f'{clock}_plain_step_us']:.1f}")
        for key, value in f.items():
            if key.startswith(f"{clock}_") and "_minus_" in key:
                mid, lo, hi = value
                name = key[len(clock) + 1 : -3].replace("_minus_", " - ")
                print(f"    {name:24s} {mid:+7.1f} [{lo:+.1f} .. {hi:+.1f}]")


def report_counts(c: dict[str, Any]) -> None:
    print(
        f"\ntorch ops per step: plain {c['plain_ops_per_step']:.0f}, "
        f"added by nbmonitor {c['added_ops_per_step']:.1f}"
    )
    for op, n in c["added_ops"].items():
        print(f"  {n:+5.1f} {op}")
    print("records per step:", c["records_per_step"])
    print("hooks:", c["hooks"])


def report_sampler(t: dict[str, Any]) -> None:
    print(f"\nsampler ({t['steps']} steps): tick wall ms {fmt(t['tick']['wall_ms'])}")
    print(f"  tick cpu ms, sampler thread: {fmt(t.get('tick_cpu_ms', {}))}")
    print(f"  run-log worker cpu ms per tick: {fmt(t.get('runlog_worker_cpu_ms', {}))}")
    print(f"  view worker cpu ms per tick: {fmt(t.get('view_worker_cpu_ms', {}))}")
    if "writer_process_cpu_ms_per_tick" in t:
        print(
            "  run log's writer process (another process) cpu ms per tick once it runs, mean: "
            f"{t['writer_process_cpu_ms_per_tick']:.2f}"
        )
    print(f"  tick cpu ms, sampler and workers: {fmt(t.get('tick_all_cpu_ms', {}))}")
    for key, v in t.items():
        if key.startswith("stage_"):
            print(f"  {key[6:]:8s} wall {fmt(v['wall_ms'])}   cpu {fmt(v.get('cpu_ms', {}))}")
    if "step_us_overlapping_a_tick" in t:
        print(f"  steps overlapping a tick, us: {fmt(t['step_us_overlapping_a_tick'])}")
        print(f"  other steps, us:              {fmt(t['step_us_other'])}")
    print("close, ms:", {k: round(v, 1) for k, v in t["close"].items()})


def fmt(p: dict[str, float]) -> str:
    if not p:
        return "-"
    return (
        f"median {p['median']:.2f} p90 {p['p90']:.2f} p99 {p['p99']:.2f} max {p['max']:.2f} "
        f"(n={p['n']})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="tiny", help="tiny, mlp20, mlp20_b64, mlp50 or gpt")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dashboard", action="store_true", help="the notebook dashboard as view")
    ap.add_argument("--warmup", type=int, default=110, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=3000, help="steps of the breakdown")
    ap.add_argument("--pairs", type=int, default=4000, help="pairs of the paired cost")
    ap.add_argument("--seconds", type=float, default=20.0, help="training time of the ticks")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument(
        "--attach",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="attach() options, values as Python literals: check_forward=True layer_every=1",
    )
    ap.add_argument(
        "--parts",
        nargs="+",
        default=["paired", "breakdown", "counts", "sampler"],
        choices=["paired", "floor", "breakdown", "counts", "sampler"],
    )
    args = ap.parse_args()
    for item in args.attach:
        key, _, value = item.partition("=")
        OPTIONS[key] = ast.literal_eval(value)
    results: dict[str, Any] = {
        **environment(),
        "task": args.task,
        "device": args.device,
        "view": "dashboard" if args.dashboard else "no view",
        "attach": OPTIONS,
    }
    parts = {
        "paired": paired,
        "floor": floor,
        "breakdown": breakdown,
        "counts": counts,
        "sampler": ticks,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.parts:
            results[name] = parts[name](args, tmp)
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
