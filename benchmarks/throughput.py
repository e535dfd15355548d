"""What tokens/s and the FLOP count cost: the per-forward token count, the one counted forward,
and the steady-state step time with the FLOPs probe on (the default) against off.

    python benchmarks/throughput.py                       # gpt and tiny, 30 s of pairs each
    python benchmarks/throughput.py --tasks gpt --seconds 120

Steady state: two bit-identical models, both attached, one with ``flops=True`` (the default)
and one with ``flops=False``, stepped in turn (A B, B A, ...) and swapped halfway, as
``paired.py`` does; the figure is the ratio of their median step times. Both count tokens
(``gpt``'s input is token ids), so that cost is timed on its own, per forward call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbmonitor
from nbmonitor._capture.inputs import token_count
from overhead import environment, make_task, train_step
from paired import WARMUP_PAIRS, swapped_ratio


def token_count_ns() -> float:
    """Nanoseconds per ``token_count`` call on a forward given token ids."""
    args, kwargs = (torch.randint(0, 512, (16, 63)),), {}
    n = 200_000
    best = min(timeit.repeat(lambda: token_count(args, kwargs), number=n, repeat=5))
    return best / n * 1e9


def counted_forward(task: str) -> dict[str, float]:
    """The first (counted) forward against the median of later ones, in ms."""
    model, loss_fn = make_task(task)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(5):  # warm the allocator and kernels before the monitored forwards
        train_step(model, loss_fn, opt, None)
    times = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        nbmonitor.attach(model, opt, run_dir=tmp, display=False) as mon,
    ):
        for _ in range(31):
            start = time.perf_counter()
            loss = loss_fn(model)
            times.append(time.perf_counter() - start)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.log(loss=loss)
    later = statistics.median(times[1:])
    return {
        "counted_ms": times[0] * 1e3,
        "forward_ms": later * 1e3,
        "extra_ms": (times[0] - later) * 1e3,
    }


def steady_state(task: str, seconds: float) -> dict[str, Any]:
    """Step time with the FLOPs probe on against off, both monitored (paired, swapped)."""
    models = []
    for _ in range(2):
        model, loss_fn = make_task(task)
        models.append((model, loss_fn, torch.optim.AdamW(model.parameters(), lr=1e-4)))
    halves = []
    with tempfile.TemporaryDirectory() as tmp:
        for on in (0, 1):  # the model with the probe on swaps halfway
            mons = [
                nbmonitor.attach(m, o, run_dir=tmp, display=False, flops=(i == on))
                for i, (m, _, o) in enumerate(models)
            ]
            times: dict[int, list[float]] = {0: [], 1: []}
            deadline = time.perf_counter() + seconds / 2
            i = 0
            while time.perf_counter() < deadline or i < 2 * WARMUP_PAIRS:
                for which in (0, 1) if i % 2 == 0 else (1, 0):
                    model, loss_fn, opt = models[which]
                    start = time.perf_counter()
                    train_step(model, loss_fn, opt, mons[which])
                    if i >= WARMUP_PAIRS:
                        times[which].append(time.perf_counter() - start)
                i += 1
            for mon in mons:
                mon.close()
            halves.append((times[on], times[1 - on]))
    ratio, (lo, hi) = swapped_ratio(halves)
    step = statistics.median(halves[0][1] + halves[1][1])
    return {
        "flops_probe": ratio,
        "ci95": (lo, hi),
        "step_ms": step * 1e3,
        "per_step_us": ratio * step * 1e6,
        "pairs": sum(len(m) for m, _ in halves),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["gpt", "tiny"])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    out: dict[str, Any] = {"environment": environment(), "token_count_ns": token_count_ns()}
    for task in args.tasks:
        out[task] = {"first_forward": counted_forward(task), **steady_state(task, args.seconds)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
