"""The batch-size estimate ("a batch of about N would have fit", docs/memory.md) against a
measured sweep (benchmarks/NOTES.md, "Batch that fits").

Each batch size runs in a fresh subprocess: an MLP trained with Adam on the CPU for a few steps
with a monitor attached, then the process's peak resident size (``VmHWM``: the kernel's
high-water mark, every byte the step touched) and what the monitor saw: its peak
(``memory_peak_bytes``), the breakdown's fixed part (parameters, buffers, gradients, optimizer
state) and its batch. For a memory limit ``L`` the *real* largest batch is the largest swept
batch whose peak stays under ``L``; the *estimate* is what ``headroom.fits`` says from one run
at a base batch, with the monitor's own peak (what the dashboard shows) and with the true peak.

    python benchmarks/batch_fit.py                       # the default sweep, JSON to stdout
    python benchmarks/batch_fit.py --batches 64 128 256 --limits-mib 900 1200
    python benchmarks/batch_fit.py --one 256             # one run (what each subprocess does)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile

WIDTH = 1024
DEPTH = 8
STEPS = 4
DEFAULT_BATCHES = tuple(range(256, 6145, 256))
DEFAULT_BASES = (256, 1024)


def one(batch: int, width: int = WIDTH, depth: int = DEPTH, kind: str = "mlp") -> dict[str, float]:
    """Train ``STEPS`` steps at ``batch`` with a monitor attached; the figures of this run.
    ``kind`` "mlp": ``depth`` x (Linear, ReLU); "tanh": one Linear and ``depth`` Tanh, whose
    saved outputs cost memory but next to no time (a large batch in a test)."""
    import torch

    import nbmonitor
    from nbmonitor._engine.derive.headroom import FIXED, fixed_bytes

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers: list[torch.nn.Module] = []
    for i in range(depth):
        if kind == "mlp":
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        else:
            layers += [torch.nn.Linear(width, width)] if i == 0 else []
            layers.append(torch.nn.Tanh())
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    opt = torch.optim.Adam(model.parameters())
    data = torch.randn(batch, width)
    import psutil

    rss0 = float(psutil.Process().memory_info().rss)
    held0 = float(sum(p.untyped_storage().nbytes() for p in model.parameters()))
    with tempfile.TemporaryDirectory() as run_dir:
        mon = nbmonitor.attach(model, opt, run_dir=run_dir, display=False, interval=0.05)
        for _ in range(STEPS):
            model(data).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        latest = mon.frame().latest
        breakdown = mon.memory()
        mon.close()
    fixed = float(sum(breakdown.bytes(c, device="cpu") for c in FIXED))
    monitor_peak = latest.get("memory_peak_bytes", math.nan)
    return {
        "batch": float(batch),
        "true_peak": own_peak_bytes(),
        "monitor_peak": monitor_peak,
        "monitor_batch": latest.get("batch_size", math.nan),
        "fixed": fixed,
        # What the estimate takes as fixed now (headroom.fixed_bytes), from the monitor's peak.
        "monitor_fixed": fixed_bytes(breakdown, "cpu", monitor_peak),
        "activations": float(breakdown.bytes("activations", device="cpu")),
        "rss_at_attach": rss0,
        "held_at_attach": held0,
    }


def own_peak_bytes() -> float:
    """This process's peak resident size since its exec: the kernel's ``VmHWM``. Not
    ``ru_maxrss``, which Linux carries over from the parent at fork: a child of a large test
    process reported the parent's size whatever its batch (seen in CI)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024  # kB
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # no /proc: KiB on Linux
    return float(peak_kib) * 1024


def run_one(
    batch: int, width: int = WIDTH, depth: int = DEPTH, kind: str = "mlp", pin_malloc: bool = False
) -> dict[str, float]:
    """``one`` in a fresh process (its own peak resident size). ``pin_malloc`` fixes glibc's
    mmap threshold, so that large tensors are mapped and unmapped as they come and go and the
    resident size follows them (glibc otherwise raises the threshold as it sees frees, and the
    peak of the same batch moves by tens of MiB from run to run)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if pin_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(batch), "--width", str(width),
         "--depth", str(depth), "--kind", kind],
        capture_output=True, text=True, timeout=600, check=True, env=env,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def real_largest(rows: list[dict[str, float]], limit: float) -> float:
    """The largest swept batch whose true peak stays under ``limit`` (NaN: none)."""
    ok = [r["batch"] for r in rows if r["true_peak"] <= limit]
    return max(ok) if ok else math.nan


def compare(rows: list[dict[str, float]], bases: list[int], limits: list[float]) -> list[dict]:
    """Per base batch and limit: the real largest batch and the estimates, with the fixed part
    as ``headroom.fixed_bytes`` takes it (``now``) and as the breakdown's alone (``before``:
    parameters, buffers, gradients, optimizer state), from the true peak and the monitor's."""
    from nbmonitor._engine.derive.headroom import CPU_ACTIVATION_FACTOR, fits

    by_batch = {int(r["batch"]): r for r in rows}
    out = []
    for base in bases:
        r = by_batch[base]
        for limit in limits:
            real = real_largest(rows, limit)
            entry: dict[str, float] = {"base": base, "limit_mib": limit / 2**20, "real": real}
            for peak in ("true_peak", "monitor_peak"):
                now = max(r["fixed"], r[peak] - CPU_ACTIVATION_FACTOR * r["activations"])
                for name, fixed in (("now", now), ("before", r["fixed"])):
                    est = fits(r["batch"], r[peak], fixed, limit)
                    entry[f"{name}_{peak}"] = est
                    entry[f"{name}_{peak}_err"] = (est - real) / real if real == real else math.nan
            out.append(entry)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", type=int)
    ap.add_argument("--width", type=int, default=WIDTH)
    ap.add_argument("--depth", type=int, default=DEPTH)
    ap.add_argument("--kind", choices=("mlp", "tanh"), default="mlp")
    ap.add_argument("--pin-malloc", action="store_true")
    ap.add_argument("--batches", type=int, nargs="+", default=list(DEFAULT_BATCHES))
    ap.add_argument("--bases", type=int, nargs="+", default=list(DEFAULT_BASES))
    ap.add_argument("--limits-mib", type=float, nargs="+")
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.width, args.depth, args.kind)))
        return 0
    batches = sorted(set(args.batches) | set(args.bases))
    rows = [run_one(b, args.width, args.depth, args.kind, args.pin_malloc) for b in batches]
    for r in rows:
        print(
            f"batch {int(r['batch']):5d}: true peak {r['true_peak'] / 2**20:7.0f} MiB, monitor "
            f"peak {r['monitor_peak'] / 2**20:7.0f} MiB, fixed {r['fixed'] / 2**20:5.0f} MiB, "
            f"activations {r['activations'] / 2**20:6.0f} MiB",
            file=sys.stderr,
        )
    peaks = sorted(r["true_peak"] for r in rows)
    limits = [m * 2**20 for m in args.limits_mib] if args.limits_mib else [
        peaks[len(peaks) // 4], peaks[len(peaks) // 2], peaks[3 * len(peaks) // 4]
    ]  # fmt: skip
    result = compare(rows, args.bases, limits)
    for e in result:
        print(
            f"base {e['base']:5.0f}, limit {e['limit_mib']:6.0f} MiB: real {e['real']:6.0f}; "
            + "; ".join(
                f"{name} ({peak}) {e[f'{name}_{peak}']:6.0f} ({e[f'{name}_{peak}_err']:+.0%})"
                for name in ("now", "before")
                for peak in ("true_peak", "monitor_peak")
            ),
            file=sys.stderr,
        )
    print(json.dumps({"rows": rows, "compare": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
