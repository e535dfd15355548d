"""What hands the GIL to the training thread between two slices of the sampler's work.

A training thread runs torch ops in a loop (a "step" of ``--ops`` small matmuls, each timed);
a second thread runs pure Python in slices of about ``--slice-us`` microseconds and, between
two, does what one hand-over mode does:

- ``none``: nothing (the interpreter's switch interval, 5 ms, decides);
- ``sleep0``: ``time.sleep(0)`` (releases the GIL; the releaser may take it straight back);
- ``sleep50``: ``time.sleep(50e-6)``;
- ``pause``: ``nbmonitor._engine.handover.Pause`` (a sleep as long as the slice took).

Printed per mode, rounds interleaved: the training thread's op time (its wait for the GIL
after each op) and step time, median / p99 / p99.9, and the slices the other thread got done.

    python -m benchmarks.handover --seconds 2 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from nbmonitor._engine.handover import Pause

MODES = ("none", "sleep0", "sleep50", "pause")


def busy(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def calibrate(slice_us: float) -> int:
    n = 1000
    start = time.thread_time()
    busy(n)
    per = (time.thread_time() - start) / n
    return max(1, int(slice_us * 1e-6 / per))


def hand_over(mode: str) -> Callable[[], None]:
    if mode == "none":
        return lambda: None
    if mode == "sleep0":
        return lambda: time.sleep(0)
    if mode == "sleep50":
        return lambda: time.sleep(50e-6)
    return Pause()


def run(mode: str, seconds: float, ops: int, n: int) -> dict[str, float]:
    a = torch.randn(64, 64)
    stop = threading.Event()
    slices = [0]

    def other() -> None:
        pause = hand_over(mode)
        while not stop.is_set():
            busy(n)
            slices[0] += 1
            pause()

    thread = threading.Thread(target=other)
    thread.start()
    op_times: list[float] = []
    steps: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(ops):
            o = time.perf_counter()
            a @ a
            op_times.append(time.perf_counter() - o)
        steps.append(time.perf_counter() - t0)
    stop.set()
    thread.join()
    o_us, s_us = np.asarray(op_times) * 1e6, np.asarray(steps) * 1e6
    return {
        "op_median": float(np.median(o_us)),
        "op_p99": float(np.quantile(o_us, 0.99)),
        "op_p999": float(np.quantile(o_us, 0.999)),
        "step_median": float(np.median(s_us)),
        "step_p99": float(np.quantile(s_us, 0.99)),
        "steps_per_s": len(steps) / seconds,
        "slices_per_s": slices[0] / seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", type=int, default=40, help="torch ops per training step")
    ap.add_argument("--slice-us", type=float, default=500.0)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = calibrate(args.slice_us)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
    for _ in range(args.rounds):
        for mode in args.modes:
            results[mode].append(run(mode, args.seconds, args.ops, n))
    print(f"slice ~{args.slice_us:.0f} us of Python, {args.ops} ops a step, load {os.getloadavg()}")
    print("mode     op us: median  p99   p99.9 | step us: median   p99 | steps/s slices/s")
    for mode, rows in results.items():
        med = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
        print(
            f"{mode:8s} {med['op_median']:12.0f} {med['op_p99']:5.0f} {med['op_p999']:7.0f} |"
            f" {med['step_median']:13.0f} {med['step_p99']:5.0f} |"
            f" {med['steps_per_s']:7.0f} {med['slices_per_s']:8.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
