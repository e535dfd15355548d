"""A monitor goes away with its model, in a real kernel: re-running a "new model + attach" cell
50 times leaves one monitor, one sampler thread and one live model."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from tests.helpers import WAIT_S

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
RERUNS = 50

SETUP = """
import gc, os, threading, weakref, torch, nbmonitor
models = []  # weak references to every model the cell built
def fds():
    return len(os.listdir("/proc/self/fd"))
"""
CELL = """
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
models.append(weakref.ref(model))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = nbmonitor.attach(model, opt, run_dir="runs", display=False, interval=0.05)
for _ in range(3):
    model(torch.randn(8, 64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
if len(models) == 2:
    fds_after_two = fds()
"""
CHECK = """
gc.collect()
# The replaced monitors close on threads of their own: wait for that (a generous bound, never
# a fixed pause), then count.
import time
deadline = time.monotonic() + 120
while time.monotonic() < deadline and (
    sum(t.name == "nbmonitor-sampler" for t in threading.enumerate()) > 1
    or fds() > fds_after_two
):
    time.sleep(0.05)
print(json.dumps({
    "samplers": sum(t.name == "nbmonitor-sampler" for t in threading.enumerate()),
    "live_models": sum(r() is not None for r in models),
    "hooks": len(model._forward_hooks),
    "fd_growth": fds() - fds_after_two,
    "status": mon.status,
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rerunning_the_attach_cell_leaves_one_monitor(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell(CELL),
        nbformat.v4.new_code_cell("import json\n" + CHECK),
    ]
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with client.setup_kernel():
        client.execute_cell(nb.cells[0], 0)
        for _ in range(RERUNS):  # the same cell, run again: what a user does
            client.execute_cell(nb.cells[1], 1)
        client.execute_cell(nb.cells[2], 2)
        # Read while the kernel runs: at its shutdown the last model goes, and its run closes.
        # A replaced run closes on a thread of its own: give the latest ones a moment.
        deadline = time.monotonic() + WAIT_S
        while True:
            runs = list((tmp_path / "runs").iterdir())
            metas = [json.loads((r / "meta.json").read_text()) for r in runs]
            # In the order they started: names (-2, -10, ...) do not sort that way.
            statuses = [m.get("status") for m in sorted(metas, key=lambda m: m["start_timestamp"])]
            if statuses.count("closed") >= RERUNS - 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    out = json.loads(nb.cells[2].outputs[0]["text"])
    assert out == {"samplers": 1, "live_models": 1, "hooks": 1, "fd_growth": 0, "status": "running"}
    assert len(runs) == RERUNS
    assert statuses == ["closed"] * (RERUNS - 1) + [None]  # the last still runs: no end yet
