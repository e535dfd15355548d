"""A tiny data-parallel job with nbmonitor attached, one process per rank (gloo on 127.0.0.1,
CPU), for tests/dist/test_job_diagnoses.py, which starts the ranks itself (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment). Arguments: run_dir, mode, steps, stall_s.

Every rank builds the same dataset (as loading one file would). Modes:

* ``healthy``: a ``DistributedSampler`` gives each rank its own shard;
* ``same``: a plain shuffling ``DataLoader`` with one seed: every rank gets the same batches;
* ``stall``: sharded, and rank 1 waits after ``STALL_AT`` steps (its data phase) until the
  file ``<run_dir>/release`` exists, while rank 0 goes on into the step's all-reduce;
* ``freeze``: sharded, and rank 1 stops itself (SIGSTOP) after ``STALL_AT`` steps, until the
  test sends it SIGCONT: a frozen process, which writes nothing;
* ``freeze_early``: as ``freeze``, after ``EARLY_AT`` steps (its 4th step), before its sampler
  has written anything;
* ``all_stall``: sharded, and every rank waits after ``STALL_AT`` steps (its data phase) until
  ``<run_dir>/release`` exists: a job stuck as a whole (a data source that hangs for all);
* ``no_sync``: sharded, every forward and backward under DDP's ``no_sync()``: the gradients
  are never all-reduced, so the ranks' models drift apart. Nothing then keeps the ranks in
  step, so each goes on past ``steps`` (20 ms a step) until ``<run_dir>/release`` exists, as a
  long job would, for rank 0 to check the other's files live.

No ``mon.log``: the loss is read from ``backward()``.
"""

from __future__ import annotations

import contextlib
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
EARLY_AT = 3


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
        thresholds=nbmonitor.Thresholds(stall_s=float(stall_s)),
    )  # fmt: skip
    release = pathlib.Path(run_dir) / "release"
    deadline = time.monotonic() + 300

    def more() -> bool:
        if step < steps:
            return True
        return mode == "no_sync" and not release.exists() and time.monotonic() < deadline

    step, epoch = 0, 0
    while more():
        if sampler is not None:
            sampler.set_epoch(epoch)
        for xb, yb in loader:
            if step == STALL_AT and (mode == "all_stall" or (rank == 1 and mode == "stall")):
                while not release.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            if rank == 1 and (mode, step) in (("freeze", STALL_AT), ("freeze_early", EARLY_AT)):
                os.kill(os.getpid(), signal.SIGSTOP)
            with model.no_sync() if mode == "no_sync" else contextlib.nullcontext():
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
            opt.step()
            step += 1
            if mode == "no_sync":
                time.sleep(0.02)
            if not more():
                break
        epoch += 1
    mon.close()
    print(f"run_dir {mon.run_dir}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
