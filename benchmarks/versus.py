"""This checkout's nbmonitor against another revision's, by paired steps: is a change faster?

Run to run, the overhead of nbmonitor on this VM moves by about a point (benchmarks/NOTES.md),
more than most changes are worth, so two versions measured one after the other cannot be told
apart. Here both are attached at once: model A to this checkout's nbmonitor, model B (a
bit-identical copy) to the revision's, imported under another package name, and the two are
stepped in turn (A B, B A, ...). Everything but the code is common to both steps of a pair:
the sampler threads of both run, the VM's drift hits both; halfway the two models swap
versions. The figure is the ratio of their median step times, the halves combined, with a
95 % bootstrap interval over resampled pairs; the same revision on both sides gives about 0.0 %.

    python benchmarks/versus.py HEAD~3                    # mlp20, 60 s
    python benchmarks/versus.py main --tasks tiny mlp20 --seconds 120
    python benchmarks/versus.py 826bf34 --tasks tiny mlp20 tiny mlp20   # tasks interleaved
    python benchmarks/versus.py 826bf34 --threads 1   # one torch thread: a loaded machine

Each line also says the machine's 1-minute load average before and after the task: on a shared
machine the interval widens with it.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbmonitor
from overhead import make_task
from paired import step_models_in_turn, swapped_ratio

ROOT = Path(__file__).resolve().parent.parent
ALIAS = "nbmonitor_ref"
# Absolute imports of the package, rewritten to the alias so that the two versions share no
# module (and no module-level state such as the registry of live monitors).
IMPORTS = re.compile(r"\bnbmonitor(?=[.\s])")


def import_revision(rev: str, into: Path) -> ModuleType:
    """The package as it is at ``rev``, imported as ``nbmonitor_ref`` from a copy in ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "nbmonitor"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    package = into / ALIAS
    (into / "nbmonitor").rename(package)
    for path in package.rglob("*.py"):
        path.write_text(IMPORTS.sub(ALIAS, path.read_text()))
    sys.path.insert(0, str(into))
    return importlib.import_module(ALIAS)


def measure(
    task: str, seconds: float, ref: ModuleType, tmp: str, clip: float | None = None
) -> dict[str, Any]:
    models = {"A": make_task(task), "B": make_task(task)}  # same seed: same weights and data
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, (m, _) in models.items()}
    halves: list[tuple[list[float], list[float]]] = []
    load_before = os.getloadavg()[0]  # the machine's load says how far to trust the interval
    # Halfway the models swap versions: twins do not run alike (paired.swapped_ratio).
    for this, other in (("A", "B"), ("B", "A")):
        mons = {
            this: nbmonitor.attach(models[this][0], opts[this], run_dir=tmp, display=False),
            other: ref.attach(models[other][0], opts[other], run_dir=tmp, display=False),
        }
        times, _ = step_models_in_turn(models, opts, mons, seconds / 2, clip)
        halves.append((times[this], times[other]))
    percent, (lo, hi) = swapped_ratio(halves)
    this_times = [t for m, _ in halves for t in m]
    ref_times = [t for _, r in halves for t in r]
    return {
        "pairs": min(len(this_times), len(ref_times)),
        "step_ms_this": statistics.median(this_times) * 1e3,
        "step_ms_ref": statistics.median(ref_times) * 1e3,
        "added_us": (statistics.median(this_times) - statistics.median(ref_times)) * 1e6,
        "percent": percent * 100,
        "percent_ci95": [lo * 100, hi * 100],
        "load": [load_before, os.getloadavg()[0]],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("rev", help="the git revision to compare this checkout with")
    ap.add_argument("--tasks", nargs="+", default=["mlp20"])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clip", type=float, help="clip_grad_norm_ to this norm every step")
    ap.add_argument(
        "--threads",
        type=int,
        help="torch's intra-op threads (default: torch's own); 1 on a loaded machine, where "
        "threads that wait on each other slow a step many times over",
    )
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        ref = import_revision(args.rev, Path(tmp) / "src")
        for task in args.tasks:
            r = measure(task, args.seconds, ref, tmp, args.clip)
            lo, hi = r["percent_ci95"]
            print(
                f"{task:10s} {r['pairs']} pairs: this checkout {r['step_ms_this']:.3f} ms, "
                f"{args.rev} {r['step_ms_ref']:.3f} ms: {r['percent']:+.2f} % "
                f"(95 % CI {lo:+.2f}..{hi:+.2f}), {r['added_us']:+.1f} us per step; "
                f"load average {r['load'][0]:.1f} -> {r['load'][1]:.1f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
