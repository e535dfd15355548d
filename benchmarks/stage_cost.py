"""What one sampler tick costs, stage by stage, measured on one thread with nothing beside it.

    python -m benchmarks.stage_cost --task tiny --steps 700 --rounds 7
    python -m benchmarks.stage_cost --task mlp50 --steps 40 --rounds 15 --profile 40

The training loop runs ``--steps`` steps with the sampler idle (``interval=3600``), then the
stages of one tick run on this thread, each timed in thread CPU time: the records stage
(``collect``), the health stage (within its budget), the run log's write (on its worker; its
thread CPU is read from the worker) and the frame the dashboard would be sent. Round after round,
so the medians are those of ticks of the same size. Nothing else competes for the GIL here:
these are the stages' own costs, the floor of what a live tick costs (``benchmarks.cost --parts
sampler`` measures the live ticks, interleaved with the loop). ``--profile N`` prints the N
functions of most cumulative time over the last round.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch
from benchmarks.overhead import make_task, train_step

import nbmonitor

STAGES = ("records", "health", "runlog", "frame", "total")


def run(args: argparse.Namespace) -> dict[str, Any]:
    model, loss_fn = make_task(args.task, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with tempfile.TemporaryDirectory() as tmp:
        mon = nbmonitor.attach(model, opt, run_dir=tmp, display=False, interval=3600)
        mon.dashboard()  # the view of a notebook, without a front end
        pipeline = mon._pipeline
        worker = pipeline.sources.runlog
        for _ in range(args.warmup):
            train_step(model, loss_fn, opt, mon)
        mon.flush()
        times: dict[str, list[float]] = {s: [] for s in STAGES}
        profile = cProfile.Profile()
        for round_ in range(args.rounds):
            for _ in range(args.steps):
                train_step(model, loss_fn, opt, mon)
            last = round_ == args.rounds - 1
            # As a scheduled tick: in slices with hand-overs (their sleeps are no thread CPU),
            # the health rules within their budget, the run log's write not waited for.
            with pipeline.lock, np.errstate(all="ignore"), pipeline.hand_over.scheduled():
                if last and args.profile:
                    profile.enable()
                t0 = time.thread_time()
                pipeline.collect()
                t1 = time.thread_time()
                pipeline.check_health()
                t2 = time.thread_time()
                before = worker.cpu_used
                pipeline.persist()
                worker.wait_idle()  # the write, on the worker
                t3 = time.thread_time()
                written = worker.cpu_used - before
                pipeline.frame(detail=True)
                t4 = time.thread_time()
                if last and args.profile:
                    profile.disable()
            times["records"].append(t1 - t0)
            times["health"].append(t2 - t1)
            times["runlog"].append(written + (t3 - t2))
            times["frame"].append(t4 - t3)
            times["total"].append(t4 - t0 + written)
        mon.close()
    result = {
        "task": args.task,
        "steps_a_tick": args.steps,
        "ms": {s: [v * 1e3 for v in vs] for s, vs in times.items()},
    }
    if args.profile:
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        top = sorted(stats.items(), key=lambda kv: -kv[1][3])[: args.profile]
        result["profile"] = [
            (f"{f.split('nbmonitor/')[-1]}:{line}({fn})", nc, tt * 1e3, ct * 1e3)
            for (f, line, fn), (_, nc, tt, ct, _) in top
        ]
    return result


def report(result: dict[str, Any]) -> None:
    steps = result["steps_a_tick"]
    print(f"{result['task']}: {steps} steps a tick, thread CPU ms (median / min / max)")
    for stage, values in result["ms"].items():
        med = statistics.median(values)
        print(
            f"  {stage:8s} {med:8.3f} / {min(values):8.3f} / {max(values):8.3f}"
            f"   {1e3 * med / steps:7.2f} us a step"
        )
    for name, calls, own, cum in result.get("profile", []):
        print(f"  {calls:6d} own {own:8.3f} cum {cum:8.3f} ms  {name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="tiny", help="tiny, mlp20, mlp20_b64, mlp50 or gpt")
    ap.add_argument("--steps", type=int, default=700, help="steps between two ticks")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--profile", type=int, default=0, help="print the top N functions")
    ap.add_argument("--json", help="write the result here too")
    args = ap.parse_args()
    torch.manual_seed(0)
    result = run(args)
    report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
