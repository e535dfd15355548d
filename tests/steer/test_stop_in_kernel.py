"""A stop ends a loop running in a notebook cell with one line and no traceback, and the cell
counts as finished: a real ipykernel (jupyter_client starts it) runs the loop."""

from __future__ import annotations

import os
import queue
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

jupyter_client = pytest.importorskip("jupyter_client")

SETUP = """
import torch, nbmonitor
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = nbmonitor.attach(model, opt, run_dir={run_dir!r}, display=False)
def step():
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""

LOOP = """
for i in range(100000):
    try:
        if i == 5:
            mon.stop()
        step()
    except Exception:  # a loop's own handler does not swallow the stop
        print("swallowed")
print("the loop ended by itself")
"""


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    km, kc = jupyter_client.manager.start_new_kernel(
        kernel_name="python3", env=env, startup_timeout=120
    )
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _run(kc: Any, code: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The execute reply and the IOPub messages of one cell, up to its idle."""
    mid = kc.execute(code)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != mid:
            continue
        out.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=120)
    while reply["parent_header"].get("msg_id") != mid:
        reply = kc.get_shell_msg(timeout=120)
    return reply, out


def _text(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


def test_a_stop_ends_the_cell_with_one_line(kernel: Any, tmp_path: Path) -> None:
    # A handler the user set before stays in force beside nbmonitor's.
    mine = "get_ipython().set_custom_exc((KeyError,), lambda *a, **k: print('mine', a[2]))"
    assert _run(kernel, mine)[0]["content"]["status"] == "ok"
    reply, _ = _run(kernel, SETUP.format(run_dir=str(tmp_path)))
    assert reply["content"]["status"] == "ok"
    reply, messages = _run(kernel, LOOP)
    assert [m["msg_type"] for m in messages if m["msg_type"] == "error"] == []
    assert _text(messages) == "nbmonitor: training stopped at step 6\n"
    assert reply["content"]["status"] == "ok"  # finished, not failed: queued cells run
    reply, messages = _run(
        kernel,
        "import sys\n"
        "print(mon.status, mon.step, hasattr(sys, 'last_traceback'))\n"
        "print(nbmonitor.open(mon.run_dir).history()['step'].tolist())",
    )
    assert _text(messages) == "stopped 6 False\n[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]\n"
    assert _text(_run(kernel, "raise KeyError(7)")[1]) == "mine 7\n"
    # Any other error still shows as IPython shows it.
    reply, messages = _run(kernel, "1 / 0")
    assert reply["content"]["status"] == "error"
    assert [m["content"]["ename"] for m in messages if m["msg_type"] == "error"] == [
        "ZeroDivisionError"
    ]
