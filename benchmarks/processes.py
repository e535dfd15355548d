"""Overhead of nbmonitor as a user meets it: a plain process against a monitored one.

``overhead.py`` and ``paired.py`` run the monitored and the plain loop in one process. That is
what makes them precise, and it also hides anything that attaching changes in the process as a
whole. The malloc heap is such a thing: glibc gives the top of its heap back to the system once
enough of it is free (trimming), and whether a training loop's tensors land there every step,
faulting their pages in again, depends on every allocation the process makes. When it happens,
the plain and the monitored model of a paired run pay it alike, and the ratio does not show it.

Here every run is a fresh process that trains one model, with or without a monitor, for a
fixed time; plain and monitored processes alternate (P A, A P, ...). Each process reports its
median and mean step time and the page faults its training thread took per step. The overhead is
the median over rounds of (monitored / plain of the same round), for the mean step (end to end:
sampler ticks included) and for the median step, with a 95 % bootstrap interval over rounds.
Processes start and warm up on their own, and two of them seconds apart can differ by 30 % on a
shared VM, so the ratios are far less precise than the in-process benchmarks'; the fault counts
are what this shows best. A monitored process settles glibc's thresholds at attach
(``nbmonitor/_heap.py``), a plain one does not and may thrash by chance; a process counts as
thrashing above THRASH_FAULTS faults per step.

    python benchmarks/processes.py --task mlp20 --rounds 10 --seconds 12
    MALLOC_TRIM_THRESHOLD_=268435456 MALLOC_MMAP_THRESHOLD_=268435456 \\
        python benchmarks/processes.py --task mlp20      # both with fixed, high thresholds
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import environment, make_task, median_ci, train_step

WARMUP_STEPS = 30
# Faults per step above which a process counts as thrashing (a plain loop here takes 0-2).
THRASH_FAULTS = 20.0


def child(task: str, mode: str, seconds: float) -> dict[str, Any]:
    """Train one model for ``seconds`` (after a warm-up), monitored or not; its step times."""
    model, loss_fn = make_task(task)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mon = None
    if mode == "attach":
        import nbmonitor

        mon = nbmonitor.attach(model, opt, run_dir=tempfile.mkdtemp(), display=False)
    times: list[float] = []
    faults = 0
    deadline = None
    while deadline is None or time.perf_counter() < deadline:
        start = time.perf_counter()
        train_step(model, loss_fn, opt, mon)
        times.append(time.perf_counter() - start)
        if deadline is None and len(times) == WARMUP_STEPS:
            times.clear()
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            deadline = time.perf_counter() + seconds
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults
    if mon is not None:
        mon.close()
    return {
        "mode": mode,
        "steps": len(times),
        "median_ms": statistics.median(times) * 1e3,
        "mean_ms": statistics.fmean(times) * 1e3,
        "faults_per_step": faults / len(times),
    }


def run_child(task: str, mode: str, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--task", task, "--seconds", str(seconds)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def summarise(rounds: list[dict[str, dict[str, Any]]], stat: str) -> dict[str, Any]:
    ratios = np.array([r["attach"][stat] / r["plain"][stat] for r in rounds])
    lo, hi = median_ci(lambda rows: np.median(ratios[rows], axis=1), len(ratios))
    return {
        "overhead_percent": (float(np.median(ratios)) - 1) * 100,
        "overhead_percent_ci95": [(lo - 1) * 100, (hi - 1) * 100],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="mlp20")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--child", choices=["plain", "attach"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.task, args.child, args.seconds)))
        return 0
    rounds: list[dict[str, dict[str, Any]]] = []
    for i in range(args.rounds):
        order = ("plain", "attach") if i % 2 == 0 else ("attach", "plain")
        row = {mode: run_child(args.task, mode, args.seconds) for mode in order}
        rounds.append(row)
        print(
            f"round {i + 1:2d}: "
            + "  ".join(
                f"{m} median {row[m]['median_ms']:.2f} ms mean {row[m]['mean_ms']:.2f} ms "
                f"faults/step {row[m]['faults_per_step']:.1f}"
                for m in ("plain", "attach")
            ),
            flush=True,
        )
    result: dict[str, Any] = {
        "environment": environment(),
        "task": args.task,
        "seconds": args.seconds,
        "rounds": rounds,
        "mean": summarise(rounds, "mean_ms"),
        "median": summarise(rounds, "median_ms"),
    }
    for mode in ("plain", "attach"):
        faults = [r[mode]["faults_per_step"] for r in rounds]
        result[f"{mode}_thrashing"] = sum(f > THRASH_FAULTS for f in faults)
        result[f"{mode}_faults_per_step_median"] = statistics.median(faults)

    def figure(stat: str) -> str:
        value = result[stat]
        lo, hi = value["overhead_percent_ci95"]
        return f"{stat} step {value['overhead_percent']:+.2f} % (95 % CI {lo:+.2f}..{hi:+.2f})"

    print(
        f"{args.task}: {args.rounds} rounds of {args.seconds:g} s, monitored / plain process: "
        f"{figure('mean')}, {figure('median')}; thrashing processes (> {THRASH_FAULTS:g} "
        f"faults per step): plain {result['plain_thrashing']}/{args.rounds}, "
        f"monitored {result['attach_thrashing']}/{args.rounds}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
