"""Where a short run's cost goes: 200-step runs of a task, plain and attached (a fresh monitor
each run) alternated in one process, each step timed; the excess per segment of the run (step
1, 2-8, 9-30, 31-100, 101-200) is the median over rounds of (attached - plain), and the counts
that depend little on the machine's load: sampled steps, probe calls and each probe's thread
CPU over the run (with OMP_NUM_THREADS=1, all of its work), what the first step imports.

    python benchmarks/short_run.py --task mlp20 --rounds 6
    python benchmarks/short_run.py --attach interval=3600   # the sampler out of it
    python benchmarks/short_run.py --rounds 0               # the counts alone
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbmonitor
from overhead import BOOTSTRAP_RESAMPLES, make_task, train_step

SEGMENTS = ((1, 1), (2, 8), (9, 30), (31, 100), (101, 200))


def _segments(times: list[float]) -> list[float]:
    return [sum(times[a - 1 : b]) for a, b in SEGMENTS]


def _run(task: str, attached: bool, steps: int, tmp: str, attach: dict[str, Any]) -> list[float]:
    model, loss_fn = make_task(task)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mon = nbmonitor.attach(model, opt, run_dir=tmp, display=False, **attach) if attached else None
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        train_step(model, loss_fn, opt, mon)
        times.append(time.perf_counter() - t)
    if mon is not None:
        mon.close()
    return times


def counts(task: str, steps: int, tmp: str, attach: dict[str, Any]) -> dict[str, Any]:
    """Probe calls by probe and moment, sampled steps, and the modules the first step imports."""
    model, loss_fn = make_task(task)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mon = nbmonitor.attach(model, opt, run_dir=tmp, display=False, **attach)
    clock = mon.internals.clock()
    calls: collections.Counter[str] = collections.Counter()
    cpu: collections.Counter[str] = collections.Counter()
    sampled: set[int] = set()
    for probe in clock.probes:
        for event in probe.events():
            method = getattr(probe, event)

            def counted(*args: Any, _m: Any = method, _k: str = f"{probe.name}.{event}") -> Any:
                calls[_k] += 1
                if _k.endswith("post_step") and getattr(_m.__self__, "sampled", False):
                    sampled.add(clock.step + 1)
                t = time.thread_time()
                try:
                    return _m(*args)
                finally:
                    cpu[_k] += time.thread_time() - t

            setattr(probe, event, counted)
    clock._plan_calls()  # the counted methods in place of the probes'
    before = set(sys.modules)
    train_step(model, loss_fn, opt, mon)
    first = sorted(set(sys.modules) - before)
    for _ in range(steps - 1):
        train_step(model, loss_fn, opt, mon)
    mon.close()
    return {
        "sampled_steps": len(sampled),
        "probe_calls": dict(sorted(calls.items())),
        # The training thread's CPU in each (with one torch thread, all of the op's work).
        "probe_cpu_ms": {k: round(v * 1e3, 1) for k, v in sorted(cpu.items())},
        "first_step_imports": first,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="mlp20")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--attach", nargs="*", default=[], help="key=value attach options")
    args = ap.parse_args()
    attach: dict[str, Any] = {}
    for item in args.attach:
        key, value = item.split("=", 1)
        attach[key] = float(value) if "." in value or key == "interval" else int(value)
    with tempfile.TemporaryDirectory() as tmp:
        c = counts(args.task, args.steps, tmp + "/counts", attach)
        print(f"sampled steps in {args.steps}: {c['sampled_steps']}")
        print("probe calls:", c["probe_calls"])
        print("probe thread CPU, ms:", c["probe_cpu_ms"])
        print(f"modules imported by the first step: {len(c['first_step_imports'])}")
        if args.rounds < 1:  # the counts alone (--rounds 0): what does not depend on the load
            return 0
        excess, plain_total = [], []
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {a: _run(args.task, a, args.steps, f"{tmp}/{r}{a}", attach) for a in order}
            excess.append(np.subtract(_segments(got[True]), _segments(got[False])))
            plain_total.append(sum(got[False]))
    e = np.asarray(excess) * 1000.0
    rows = np.random.default_rng(0).integers(0, len(e), size=(BOOTSTRAP_RESAMPLES, len(e)))
    names = [f"{a}-{b}" if a != b else str(a) for a, b in SEGMENTS] + ["all"]
    e = np.column_stack([e, e.sum(axis=1)])
    plain = statistics.median(plain_total) * 1000.0
    print(f"{args.task}, {args.rounds} rounds, plain run median {plain:.0f} ms; excess ms [95 %]:")
    for i, name in enumerate(names):
        lo, hi = np.quantile(np.median(e[:, i][rows], axis=1), [0.025, 0.975])
        print(f"  steps {name:8s} {np.median(e[:, i]):+8.1f} [{lo:+.1f} .. {hi:+.1f}]")
    print(f"  all: {100 * np.median(e[:, -1]) / plain:+.1f} % of the plain run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
