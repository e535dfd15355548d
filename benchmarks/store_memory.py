"""Store scale benchmark: memory, append speed and series() time for a 1,000,000-step run.

Run from the repo root (or with nbmonitor installed):
``PYTHONPATH=. python benchmarks/store_memory.py [--rows N] [--metrics M] [--chunk C] [--sparse K]``

Appends N rows of M random metrics (plus step and time) with chunked ``extend`` (the sampler
hands over one batch per tick), prints the store's ``nbytes`` at 10^4, 10^5 and 10^6 rows, the
peak process RSS growth, the append time in total and per row, and the median time of
``series()`` on the final store. Building the row dicts is excluded from the append time.
``--sparse K`` adds K keys each logged on every K-th step (key k on the steps where
step % K == k), as eval metrics logged now and then.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

import numpy as np

from nbmonitor._engine.store import Store

MB = 1024 * 1024


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description="Store scale benchmark.")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--chunk", type=int, default=10_000)
    parser.add_argument("--sparse", type=int, default=0)
    args = parser.parse_args()

    names = [f"metric_{i}" for i in range(args.metrics)]
    rng = np.random.default_rng(0)
    store = Store()
    checkpoints = {10**4, 10**5, 10**6}
    rss0 = _peak_rss_bytes()
    append_s = 0.0
    done = 0
    print(
        f"Store(): {args.rows:,} rows x {args.metrics} metrics, extend() in chunks of {args.chunk}"
        + (f", {args.sparse} keys each on every {args.sparse}th step" if args.sparse else "")
    )
    while done < args.rows:
        n = min(args.chunk, args.rows - done, *(c - done for c in checkpoints if c > done))
        values = rng.standard_normal((n, args.metrics)).tolist()
        rows = [
            {"step": float(done + k), "time": (done + k) * 0.05, **dict(zip(names, v, strict=True))}
            for k, v in enumerate(values)
        ]
        if args.sparse:
            for k, row in enumerate(rows):
                row[f"sparse_{(done + k) % args.sparse}"] = float(done + k)
        t0 = time.perf_counter()
        store.extend(rows)
        append_s += time.perf_counter() - t0
        done += n
        if done in checkpoints:
            print(f"  {done:>9,} rows: nbytes = {store.nbytes / MB:6.2f} MB")
    print(f"  {done:>9,} rows (end): nbytes = {store.nbytes / MB:6.2f} MB")
    rss_delta = _peak_rss_bytes() - rss0
    print(f"peak RSS growth: {rss_delta / MB:.1f} MB (includes the row dicts of one chunk)")
    print(f"append: {append_s:.2f} s total, {append_s / args.rows * 1e6:.2f} us/row")

    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        x, _y = store.series(names[0] if names else "sparse_0", max_points=2000)
        times.append(time.perf_counter() - t0)
    print(
        f"series(max_points=2000): median {statistics.median(times) * 1e3:.2f} ms "
        f"over 20 calls, {len(x)} points, bucket width {store.bucket_width}"
    )
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        store.history()
        times.append(time.perf_counter() - t0)
    print(f"history(): median {statistics.median(times) * 1e3:.2f} ms over 5 calls")


if __name__ == "__main__":
    main()
