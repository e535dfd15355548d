"""A tiny data-parallel job with nbmonitor attached, one process per rank (gloo on 127.0.0.1,
CPU), for tests/dist/test_job_diagnoses.py, which starts the ranks itself (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment). Arguments: run_dir, mode, steps, stall_s.

Every rank builds the same dataset (as loading one file would). Modes:

* ``healthy``: a ``DistributedSampler`` gives each rank its own shard;
* ``same``: a plain shuffling ``DataLoader`` with one seed: every rank gets the same batches;
* ``stall``: sharded, and rank 1 waits after ``STALL_AT`` steps (its data phase) until the
  file ``<run_dir>/release`` exists, while rank 0 goes on into the step's all-reduce;
* ``freeze``: sharded, and rank 1 stops itself (SIGSTOP) after ``STALL_AT`` steps, until the
  test sends it SIGCONT: a frozen process, which writes nothing.

No ``mon.log``: the loss is read from ``backward()``.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import nbmonitor

STALL_AT = 20


def main() -> None:
    run_dir, mode, steps, stall_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    data = TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(512, 1))
    sampler = None if mode == "same" else DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(
        data,
        batch_size=8,
        sampler=sampler,
        shuffle=sampler is None,
        generator=torch.Generator().manual_seed(0) if sampler is None else None,
    )
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(
        model, opt, run_dir=run_dir, interval=0.1, layer_every=0,
        thresholds={"stall_s": float(stall_s)},
    )  # fmt: skip
    step, epoch = 0, 0
    while step < steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for xb, yb in loader:
            if rank == 1 and step == STALL_AT:
                if mode == "stall":
                    release = pathlib.Path(run_dir) / "release"
                    deadline = time.monotonic() + 300
                    while not release.exists() and time.monotonic() < deadline:
                        time.sleep(0.05)
                elif mode == "freeze":
                    os.kill(os.getpid(), signal.SIGSTOP)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == steps:
                break
        epoch += 1
    mon.close()
    print(f"run_dir {mon.run_dir}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
