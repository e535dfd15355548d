"""The cost of a user span on the CPU: ``with mon.span(name): pass`` (enter + exit, the record
included), as the decorator, and nested, less the same loop around a no-op context manager.

Rounds of each variant alternate (A B C ..., then again) so that a drifting VM hits them all
alike; the figure is the median over rounds of the time per span, in microseconds.

    python benchmarks/spans.py                 # 200,000 spans per round, 7 rounds
    python benchmarks/spans.py --n 50000 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

import nbmonitor


def per_call(loop: Callable[[int], None], n: int) -> float:
    start = time.perf_counter()
    loop(n)
    return (time.perf_counter() - start) / n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    model = torch.nn.Linear(4, 1)
    with tempfile.TemporaryDirectory() as tmp:
        mon = nbmonitor.attach(model, None, run_dir=tmp, display=False)
        try:
            span = mon.span("data")
            null = contextlib.nullcontext()

            def baseline(n: int) -> None:
                for _ in range(n):
                    with null:
                        pass

            def reused(n: int) -> None:
                for _ in range(n):
                    with span:
                        pass

            def created(n: int) -> None:
                for _ in range(n):
                    with mon.span("data"):
                        pass

            @mon.span("eval")
            def decorated() -> None:
                return None

            def plain() -> None:
                return None

            def call_decorated(n: int) -> None:
                for _ in range(n):
                    decorated()

            def call_plain(n: int) -> None:
                for _ in range(n):
                    plain()

            def nested(n: int) -> None:
                inner = mon.span("inner")
                for _ in range(n):
                    with span, inner:
                        pass

            variants: dict[str, tuple[Callable[[int], None], Callable[[int], None], int]] = {
                "with span (object reused)": (reused, baseline, 1),
                'with mon.span("data") (made each time)': (created, baseline, 1),
                "@mon.span decorator, per call": (call_decorated, call_plain, 1),
                "two nested spans, per span": (nested, baseline, 2),
            }
            results: dict[str, list[float]] = {k: [] for k in variants}
            for _ in range(args.rounds):
                for name, (loop, base, spans) in variants.items():
                    cost = per_call(loop, args.n) - per_call(base, args.n)
                    results[name].append(cost / spans)
                    mon.flush()  # the sampler takes the records before the next round
        finally:
            mon.close()
    print(f"torch {torch.__version__}, {args.n} spans x {args.rounds} rounds, CPU")
    for name, costs in results.items():
        print(f"{name:42s} {statistics.median(costs) * 1e6:6.2f} us per span (enter + exit)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
