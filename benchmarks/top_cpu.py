"""CPU cost of ``nbmonitor top`` at 1 Hz: 8 (fake) GPUs and 20 runs being written.

Run from the repo root: ``PYTHONPATH=. python benchmarks/top_cpu.py [--seconds 60]``

Starts ``python -m nbmonitor top --runs DIR --interval 1`` in a pseudo-terminal (120x40), as a user
would over SSH, with a fake ``pynvml`` of ``--gpus`` GPUs (tests/fake_pynvml.py, so NVML's own
driver time is not in it: see benchmarks/NOTES.md ("GPU") for the calls' latency on a real GPU),
while one writer process appends a step (and every 50 steps an alert) to each of ``--runs`` runs
``--rate`` times a second. After ``--warmup`` seconds it reads the top process's CPU time (user +
system, every thread) over ``--seconds`` seconds, in windows of ``--window`` seconds, and prints the
share of one core: median and range of the windows.
``--once`` measures ``nbmonitor top --once`` (one shot) instead: its wall time.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pathlib
import pty
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import textwrap
import time

import psutil

ROOT = pathlib.Path(__file__).resolve().parent.parent

WRITER = textwrap.dedent(
    """
    import math, sys, time
    from nbmonitor.sinks import Batch
    from nbmonitor.sinks.runlog import RunLogSink
    root, runs, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    logs = [RunLogSink.create(root, f"run{i:02d}", {"attach": {"total_steps": 10**6}})
            for i in range(runs)]
    step = 0
    while True:
        step += 1
        now = time.time()
        for i, log in enumerate(logs):
            row = {"step": step, "time": now, "loss": 2 * math.exp(-step / 500) + 0.01 * i,
                   "grad_norm": 1.0, "step_time": 1 / rate, "samples_per_s": 64 * rate,
                   "phase_forward_s": 0.01, "phase_backward_s": 0.02, "lr": 1e-3}
            streams = {"steps": [row]}
            if step % 50 == 0:
                streams["events"] = [{"rule": "loss_spike", "severity": "warning",
                    "message": f"loss spiked at {step}", "step": step, "time": now,
                    "layers": [], "subject": "loss"}]
            log.write(Batch(streams))
            log.flush()
        time.sleep(1 / rate)
    """
)

FAKE_PYNVML = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from fake_pynvml import FakeGpu, FakeNvml
    sys.modules[__name__] = FakeNvml(
        [FakeGpu(f"GPU-{{i}}", util=10 * i, processes=[(1000 + i, 2**30), (2000 + i, 2**29)])
         for i in range({gpus})]
    )
    """
)


def drain(fd: int, until: float) -> None:
    """Read (and drop) the app's output until ``until``, as a terminal would."""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], max(0.0, until - time.monotonic()))
        if ready:
            try:
                os.read(fd, 1 << 16)
            except OSError:
                return


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--rate", type=float, default=10.0, help="steps per second per run")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=15.0)
    p.add_argument("--once", action="store_true")
    args = p.parse_args()

    work = pathlib.Path(tempfile.mkdtemp(prefix="nbm-top-"))
    runs_dir, fake = work / "runs", work / "fake"
    runs_dir.mkdir()
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML.format(tests=str(ROOT / "tests"), gpus=args.gpus))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)])}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(runs_dir), str(args.runs), str(args.rate)], env=env
    )
    try:
        time.sleep(3.0)  # the runs exist and have a few steps
        cmd = [sys.executable, "-m", "nbmonitor", "top", "--runs", str(runs_dir)]
        if args.once:
            start = time.perf_counter()
            done = subprocess.run([*cmd, "--once"], env=env, capture_output=True, check=True)
            wall = time.perf_counter() - start
            print(f"top --once: {wall:.2f} s wall; {len(done.stdout)} bytes printed")
            return
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(sys.executable, [*cmd, "--interval", "1"], {**env, "TERM": "xterm-256color"})
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        proc = psutil.Process(pid)
        drain(fd, time.monotonic() + args.warmup)
        shares = []
        last = sum(proc.cpu_times()[:2])
        last_t = time.monotonic()
        end = last_t + args.seconds
        while time.monotonic() < end - 1e-6:
            drain(fd, min(end, time.monotonic() + args.window))
            cpu, now = sum(proc.cpu_times()[:2]), time.monotonic()
            shares.append((cpu - last) / (now - last_t) * 100)
            last, last_t = cpu, now
        rss = proc.memory_info().rss
        os.kill(pid, signal.SIGTERM)
        drain(fd, time.monotonic() + 2)
        os.waitpid(pid, 0)
        print(
            f"nbmonitor top at 1 Hz, {args.gpus} fake GPUs, {args.runs} runs at {args.rate:g} "
            f"steps/s each: {statistics.median(shares):.2f} % of a core (median of "
            f"{len(shares)} windows of {args.window:g} s; range {min(shares):.2f}-"
            f"{max(shares):.2f} %), RSS {rss / 2**20:.0f} MiB"
        )
    finally:
        writer.kill()
        writer.wait()


if __name__ == "__main__":
    main()
