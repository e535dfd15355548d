"""This checkout's nbmonitor against another revision's, by paired steps: is a change faster?

Run to run, the overhead of nbmonitor on this VM moves by about a point (docs/performance.md),
more than most changes are worth, so two versions measured one after the other cannot be told
apart. Here both are attached at once: model A to this checkout's nbmonitor, model B (a
bit-identical copy) to the revision's, imported under another package name, and the two are
stepped in turn (A B, B A, ...). Everything but the code is common to both steps of a pair:
the sampler threads of both run, the VM's drift hits both. The figure is the ratio of their
median step times, with a 95 % bootstrap interval over resampled pairs; the same revision on
both sides gives about 0.0 %.

    python benchmarks/versus.py HEAD~3                    # mlp20, 60 s
    python benchmarks/versus.py main --tasks tiny mlp20 --seconds 120
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbmonitor
from overhead import make_task, median_ci
from paired import step_in_turn

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


def measure(task: str, seconds: float, ref: ModuleType, tmp: str) -> dict[str, Any]:
    model_a, loss_a = make_task(task)
    model_b, loss_b = make_task(task)  # same seed: the same weights and data
    opt_a = torch.optim.AdamW(model_a.parameters(), lr=1e-4)
    opt_b = torch.optim.AdamW(model_b.parameters(), lr=1e-4)
    mon_a = nbmonitor.attach(model_a, opt_a, run_dir=tmp, display=False)
    mon_b = ref.attach(model_b, opt_b, run_dir=tmp, display=False)
    times: dict[str, list[float]] = {"A": [], "B": []}

    def step(which: str) -> None:
        model, loss_fn, opt, mon = (
            (model_a, loss_a, opt_a, mon_a) if which == "A" else (model_b, loss_b, opt_b, mon_b)
        )
        start = time.perf_counter()
        loss = loss_fn(model)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.log(loss=loss)
        times[which].append(time.perf_counter() - start)

    def warmed() -> None:
        times["A"].clear()
        times["B"].clear()

    try:
        step_in_turn(step, seconds, warmed)
    finally:
        mon_a.close()
        mon_b.close()
    a, b = np.asarray(times["A"]), np.asarray(times["B"][: len(times["A"])])
    lo, hi = median_ci(lambda rows: np.median(a[rows], axis=1) / np.median(b[rows], axis=1), len(a))
    return {
        "pairs": len(a),
        "step_ms_this": statistics.median(a) * 1e3,
        "step_ms_ref": statistics.median(b) * 1e3,
        "added_us": (statistics.median(a) - statistics.median(b)) * 1e6,
        "percent": (statistics.median(a) / statistics.median(b) - 1) * 100,
        "percent_ci95": [(lo - 1) * 100, (hi - 1) * 100],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("rev", help="the git revision to compare this checkout with")
    ap.add_argument("--tasks", nargs="+", default=["mlp20"])
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ref = import_revision(args.rev, Path(tmp) / "src")
        for task in args.tasks:
            r = measure(task, args.seconds, ref, tmp)
            lo, hi = r["percent_ci95"]
            print(
                f"{task:10s} {r['pairs']} pairs: this checkout {r['step_ms_this']:.3f} ms, "
                f"{args.rev} {r['step_ms_ref']:.3f} ms: {r['percent']:+.2f} % "
                f"(95 % CI {lo:+.2f}..{hi:+.2f}), {r['added_us']:+.1f} us per step"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
