"""The training thread's fixed cost with its code warm: a monitored twin and a twin that only
takes the gradient norms, stepped in turn (two models, as against the five of ``benchmarks.cost
--parts floor``), in the thread's CPU time.

    python benchmarks/warm_pair.py                  # tiny, 3000 pairs
    python benchmarks/warm_pair.py --twins 5        # with three plain twins stepped between
    python benchmarks/warm_pair.py --hooks          # and a twin with the same hooks, empty
    python benchmarks/warm_pair.py --versus main    # this checkout against a revision, paired
    python benchmarks/warm_pair.py --bytecodes      # Python bytecodes a step, counted, by function
    python benchmarks/warm_pair.py --alternate      # the twins' order reversed every other pass

With ``--hooks`` a third twin carries the hooks nbmonitor registers at defaults, each empty (its
pre-step one takes the norms, as the norm twin does): ``hooks - norm`` is torch's own dispatch
of those hooks, ``monitored - hooks`` what nbmonitor does in them (benchmarks/cost.py's floor,
warm).

With ``--bytecodes`` nothing is timed: the Python bytecodes each twin's step executes are
counted (``sys.settrace`` opcode events, every frame: nbmonitor's and torch's), and the
monitored twin's excess over the norm twin's is printed by function. Stable on any machine
(for one Python and torch version): between two hooks torch's own work evicts the
interpreter's caches, so each bytecode a step runs costs ~20 ns there, several times its warm
cost (benchmarks/NOTES.md, "The training thread's hooks", fourth session).

With ``--alternate`` the two twins swap places every other pass. Stepped in a fixed order the
norm twin, stepped first, pays a few µs a step that the monitored one does not (about 9 µs on
the developers' VM: benchmarks/NOTES.md, "Issue 39 at the end of its fourth session"), so the
default figure understates the cost by that; the issue's figures were taken in the fixed order.

With ``--versus REV`` the pair is stepped twice over in each pass, once monitored by this
checkout and once by the revision's nbmonitor (imported under another name, as
``benchmarks/versus.py`` does; both wrappers of ``torch.autograd.backward`` are in every
backward), the two pairs' order swapped halfway: ``this - REV`` is the median of the per-pass
differences between the two monitored steps. Runs of one version after the other move by 2-4 us
a step on a shared machine, more than most changes here are worth.

With five twins stepped in turn (``--twins 5``, as the floor does) each step runs with its code
and data evicted by the four others', and nbmonitor's ~30 Python calls a step cost about twice
what they cost warm: this measure says which of the two a change moved (benchmarks/NOTES.md,
"One record a step and the CUDA step's crossing").
"""

from __future__ import annotations

import argparse
import collections
import importlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbmonitor
from cost import _empty_hooks
from nbmonitor._capture.probes.grad_norms import NormPass
from overhead import BOOTSTRAP_RESAMPLES, make_task


def _twin(
    task: str, kind: str, run_dir: str, package: Any = nbmonitor
) -> tuple[Callable[[], None], object]:
    model, loss_fn = make_task(task)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mon = (
        package.attach(model, opt, run_dir=run_dir, display=False, interval=3600)
        if kind == "monitored"
        else None
    )
    norms = NormPass(list(model.parameters()))
    if kind == "hooks":
        _empty_hooks(model, opt, norms)

    def step() -> None:
        loss = loss_fn(model)
        loss.backward()
        if kind == "norm":
            norms.take()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mon is not None:
            mon.log(loss=loss)

    return step, mon


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="tiny")
    ap.add_argument("--twins", type=int, default=2, help="2: the pair alone; more: plain twins")
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--hooks", action="store_true", help="a twin with the same hooks, empty")
    ap.add_argument("--versus", metavar="REV", help="against a git revision's nbmonitor")
    ap.add_argument("--bytecodes", action="store_true", help="count bytecodes, time nothing")
    ap.add_argument(
        "--alternate", action="store_true", help="the twins' order reversed every other pass"
    )
    args = ap.parse_args()
    if args.versus:
        return _versus(args)
    if args.bytecodes:
        return _bytecodes(args)
    with tempfile.TemporaryDirectory() as tmp:
        kinds = ["norm", "monitored"] + ["hooks"] * args.hooks
        kinds += ["plain"] * max(0, args.twins - len(kinds))
        twins = [_twin(args.task, kind, tmp) for kind in kinds]
        for _ in range(args.warmup):
            for step, _ in twins:
                step()
        clock = time.thread_time_ns
        times: list[list[int]] = [[] for _ in twins]
        pairs = list(zip(twins, times, strict=True))
        for i in range(args.pairs):
            # The twin stepped first pays a few us more (helper thr's notes): --alternate
            # reverses the order every other pass, so that neither carries it.
            for (step, _), out in pairs[::-1] if args.alternate and i % 2 else pairs:
                t = clock()
                step()
                out.append(clock() - t)
        for _, mon in twins:
            if mon is not None:
                mon.close()  # type: ignore[attr-defined]
    print(
        f"{args.task}, {len(twins)} twins, {args.pairs} pairs: norm step "
        f"{statistics.median(times[0]) / 1000:.1f} us; monitored - norm {_diff(times[1], times[0])}"
    )
    if args.hooks:
        hooks, mine = _diff(times[2], times[0]), _diff(times[1], times[2])
        print(f"  hooks - norm {hooks}, monitored - hooks {mine}")
    return 0


def _bytecodes(args: argparse.Namespace, steps: int = 20) -> int:
    def count(step: Callable[[], None]) -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()

        def trace(frame: FrameType, event: str, arg: object) -> Any:
            frame.f_trace_opcodes = True
            if event == "opcode":
                code = frame.f_code
                counts[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
            return trace

        sys.settrace(trace)
        try:
            for _ in range(steps):
                step()
        finally:
            sys.settrace(None)
        return counts

    with tempfile.TemporaryDirectory() as tmp:
        twins = [_twin(args.task, kind, tmp) for kind in ("norm", "monitored")]
        for _ in range(args.warmup):
            for step, _ in twins:
                step()
        norm, monitored = (count(step) for step, _ in twins)
        for _, mon in twins:
            if mon is not None:
                mon.close()  # type: ignore[attr-defined]
    total = (monitored.total() - norm.total()) / steps
    print(f"{args.task}: monitored - norm {total:+.0f} bytecodes a step")
    added = {k: (monitored[k] - norm[k]) / steps for k in monitored.keys() | norm.keys()}
    for name, n in sorted(added.items(), key=lambda kv: -abs(kv[1])):
        if abs(n) >= 1:
            print(f"  {n:+7.1f}  {name}")
    return 0


def _versus(args: argparse.Namespace) -> int:
    from versus import import_revision

    with tempfile.TemporaryDirectory() as tmp:
        ref = import_revision(args.versus, Path(tmp) / "ref")
        ours = [_twin(args.task, "norm", tmp), _twin(args.task, "monitored", tmp)]
        theirs = [_twin(args.task, "norm", tmp), _twin(args.task, "monitored", tmp, ref)]
        # Each version's wrapper of torch.autograd.backward in every backward (the one attached
        # second finds the first's in place and leaves it: its listener would never run).
        intercept: Any = importlib.import_module(f"{ref.__name__}._capture.intercept")
        if torch.autograd.backward is not intercept.backward:
            intercept._ORIGINAL_BACKWARD = torch.autograd.backward
            torch.autograd.backward = intercept.backward
        for _ in range(args.warmup):
            for step, _ in ours + theirs:
                step()
        clock = time.thread_time_ns
        times: dict[str, list[int]] = {k: [] for k in ("norm", "this", "norm_ref", "ref")}
        labelled = [*zip(("norm", "this", "norm_ref", "ref"), ours + theirs, strict=True)]
        for i in range(args.pairs):
            order = labelled if i < args.pairs // 2 else labelled[2:] + labelled[:2]
            for label, (step, _) in order:
                t = clock()
                step()
                times[label].append(clock() - t)
        for _, mon in ours + theirs:
            if mon is not None:
                mon.close()  # type: ignore[attr-defined]
    this = np.asarray(times["this"]) - np.asarray(times["norm"])
    theirs_added = np.asarray(times["ref"]) - np.asarray(times["norm_ref"])
    print(
        f"{args.task}, {args.pairs} passes of two pairs: this - norm "
        f"{_diff(times['this'], times['norm'])}; {args.versus} - norm "
        f"{_diff(times['ref'], times['norm_ref'])}; (this - norm) - ({args.versus} - norm) "
        f"{_diff(list(this), list(theirs_added))}"
    )
    return 0


def _diff(a: list[int], b: list[int]) -> str:
    """The median of the per-pass differences (us) and its 95 % bootstrap interval."""
    d = (np.asarray(a) - np.asarray(b)) / 1000.0
    rows = np.random.default_rng(0).integers(0, len(d), size=(BOOTSTRAP_RESAMPLES, len(d)))
    lo, hi = np.quantile(np.median(d[rows], axis=1), [0.025, 0.975])
    return f"{np.median(d):+.1f} us [{lo:+.1f} .. {hi:+.1f}]"


if __name__ == "__main__":
    raise SystemExit(main())
