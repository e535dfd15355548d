"""Steps lost when a monitored process is killed with SIGKILL (kill -9).

Run from the repo root: ``PYTHONPATH=. python benchmarks/kill_loss.py [--kills N] [--interval S]``

Each trial starts a training loop (a small MLP, about a millisecond a step) attached with
``interval`` in a child process. After every optimizer step the child stores its step count and
the wall time in a shared memory map (no system call). The parent kills it with SIGKILL at a
random moment 1-3 s in, waits until no process holds the run's files open (a busy run's
writer process still writes the rows it was sent; at most 10 s), then opens the run directory
and compares the last step on disk with the last step the loop finished. Reports the steps
lost, and the seconds of training they cover, per kill: the promise is at most one interval.
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import nbmonitor

CHILD = """
import mmap, struct, sys, time, torch, nbmonitor
run_dir, interval, shared = sys.argv[1], float(sys.argv[2]), sys.argv[3]
with open(shared, "r+b") as f:
    mem = mmap.mmap(f.fileno(), 16)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = nbmonitor.attach(model, opt, run_dir=run_dir, interval=interval, display=False)
print(mon.run_dir, flush=True)
step = 0
while True:
    loss = model(torch.randn(32, 64)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    mon.log(loss=loss)
    step += 1
    mem[:16] = struct.pack("<qd", step, time.time())
"""


def _writing(run_dir: Path) -> bool:
    """Whether a process still holds a file of ``run_dir`` open (Linux's /proc; elsewhere
    False)."""
    prefix = str(run_dir.resolve())
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                if os.readlink(fd).startswith(prefix):
                    return True
        except OSError:
            continue
    return False


def _settle(run_dir: Path, limit_s: float = 10.0) -> None:
    """Wait until no process writes the run (at most ``limit_s``): the run log's writer
    process outlives a killed parent by the time it takes to write what it was sent."""
    deadline = time.monotonic() + limit_s
    while _writing(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)


def trial(interval: float, rng: random.Random) -> tuple[int, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        shared = Path(tmp) / "shared"
        shared.write_bytes(b"\0" * 16)
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHILD), tmp, str(interval), str(shared)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            run_dir = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
            time.sleep(rng.uniform(1.0, 3.0))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            proc.kill()
            proc.stdout.close()  # type: ignore[union-attr]
        _settle(run_dir)
        with open(shared, "rb") as f:
            done, done_time = struct.unpack("<qd", mmap.mmap(f.fileno(), 16, prot=mmap.PROT_READ))
        history = nbmonitor.open(run_dir).history()
        steps, times = history.get("step"), history.get("time")
        on_disk = int(steps[-1]) if steps is not None and len(steps) else 0
        disk_time = float(times[-1]) if times is not None and len(times) else float("nan")
        return done - on_disk, done_time - disk_time, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    lost_steps, lost_s = [], []
    for i in range(args.kills):
        steps, seconds, done = trial(args.interval, rng)
        lost_steps.append(steps)
        lost_s.append(seconds)
        print(f"kill {i + 1}: {done} steps done, {steps} lost ({seconds:.3f} s of training)")
    print(
        f"interval {args.interval} s, {args.kills} kills: steps lost median "
        f"{statistics.median(lost_steps)}, max {max(lost_steps)}; seconds of training lost "
        f"median {statistics.median(lost_s):.3f}, max {max(lost_s):.3f}"
    )


if __name__ == "__main__":
    main()
