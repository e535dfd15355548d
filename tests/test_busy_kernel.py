"""A steering button's message reaches a kernel busy running the loop in the cell's main thread.

A real ipykernel (jupyter_client starts it) runs a dashboard whose steering goes to a stand-in
``Steering``; the test sends the comm message a front end sends for a button while a cell
loops, and checks that the loop saw the request before it ended, that the request was handled
off the main thread, that the next cell still runs after the busy one (nothing reordered),
and that a user's own thread keeps printing under its cell after a steering message.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
ipykernel = pytest.importorskip("ipykernel")

SETUP = """
import threading, time
from nbmonitor.ui.dashboard import Dashboard
from nbmonitor.live.steer_link import DashboardSteering

class FakeSteering:
    paused = False
    stop_requested = False
    last_step = 0
    def __init__(self):
        self.requests = []
    def request(self, kind, value=None, *, source="python", at_step=None):
        on_main = threading.current_thread() is threading.main_thread()
        self.requests.append((kind, value, source, on_main))

steering = FakeSteering()
link = DashboardSteering(steering)
dash = Dashboard("run", "cpu", None, steer=link.hooks)
link.route(dash.widget)
print(dash.widget.comm.comm_id, link.routed)
"""

# Bounded: 60 s of 10 ms sleeps; a message that waits for the cell to end makes it run out.
BUSY = """
print("looping", flush=True)
for i in range(6000):
    if steering.requests:
        break
    time.sleep(0.01)
print("seen", i < 5999, steering.requests)
"""


class Kernel:
    def __init__(self) -> None:
        env = dict(os.environ)
        self.km, self.kc = jupyter_client.manager.start_new_kernel(
            kernel_name="python3", env=env, startup_timeout=120
        )

    def execute(self, code: str) -> str:
        return str(self.kc.execute(code))

    def messages(self, until_idle: str, timeout: float = 120.0) -> list[dict[str, Any]]:
        """IOPub messages until the request ``until_idle`` is done (its idle status)."""
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            out.append(msg)
            if (
                msg["msg_type"] == "status"
                and msg["parent_header"].get("msg_id") == until_idle
                and msg["content"]["execution_state"] == "idle"
            ):
                return out
        raise AssertionError(f"request {until_idle} did not finish in {timeout} s")

    def wait_for_text(self, parent: str, text: str, timeout: float = 120.0) -> list[dict[str, Any]]:
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            out.append(msg)
            if (
                msg["msg_type"] == "stream"
                and msg["parent_header"].get("msg_id") == parent
                and text in msg["content"]["text"]
            ):
                return out
        raise AssertionError(f"no {text!r} from {parent} in {timeout} s")

    def run(self, code: str) -> str:
        mid = self.execute(code)
        return stdout(self.messages(mid), mid)

    def send_steer(self, comm_id: str, content: dict[str, Any]) -> None:
        msg = self.kc.session.msg(
            "comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": content}}
        )
        self.kc.shell_channel.send(msg)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def stdout(messages: list[dict[str, Any]], parent: str) -> str:
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == parent
    )


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    try:
        yield k
    finally:
        k.close()


@pytest.fixture(scope="module")
def comm_id(kernel: Kernel) -> str:
    out = kernel.run(SETUP).split()
    assert out[1] == "True", "ipykernel 7 with subshells routes steering past the main thread"
    return out[0]


def test_a_button_reaches_a_loop_running_in_the_cell(kernel: Kernel, comm_id: str) -> None:
    busy = kernel.execute(BUSY)
    first = kernel.wait_for_text(busy, "looping")
    kernel.send_steer(comm_id, {"type": "steer", "kind": "pause"})
    # The next cell, sent while the loop runs: it waits for the busy one, as always.
    after = kernel.execute("print('after', steering.requests[0][0])")
    messages = first + kernel.messages(busy)
    # The subshell's own busy/idle name the steering message, never the running cell (a front
    # end takes the cell's idle for its end): one idle for the cell, at its end.
    idles = [
        m
        for m in messages
        if m["msg_type"] == "status"
        and m["content"]["execution_state"] == "idle"
        and m["parent_header"].get("msg_id") == busy
    ]
    assert len(idles) == 1 and messages[-1] is idles[0]
    assert "seen True [('pause', None, 'dashboard', False)]" in stdout(messages, busy)
    more = kernel.messages(after)
    assert stdout(more, after).strip() == "after pause"
    started = [
        m["parent_header"]["msg_id"] for m in messages + more if m["msg_type"] == "execute_input"
    ]
    assert started.index(busy) < started.index(after)


def test_malformed_requests_are_ignored(kernel: Kernel, comm_id: str) -> None:
    kernel.run("steering.requests.clear()")
    for content in (
        {"type": "steer", "kind": "explode"},
        {"type": "steer", "kind": "lr", "value": -1},
        {"type": "steer", "kind": "lr", "value": "nan"},
        {"type": "other", "kind": "pause"},
    ):
        kernel.send_steer(comm_id, content)
    kernel.send_steer(comm_id, {"type": "steer", "kind": "lr", "value": 0.003})
    out = kernel.run(
        "for _ in range(3000):\n"
        "    if steering.requests: break\n"
        "    time.sleep(0.01)\n"
        "print([r[:2] for r in steering.requests])"
    )
    assert out.strip() == "[('lr', 0.003)]"


def test_a_users_thread_keeps_printing_under_its_cell(kernel: Kernel, comm_id: str) -> None:
    kernel.run("steering.requests.clear()")
    code = (
        "def chatter():\n"
        "    i = 0\n"
        "    while not steering.requests and i < 3000:\n"
        "        print('tick', i, flush=True); i += 1; time.sleep(0.02)\n"
        "    for j in range(5):\n"
        "        print('later', j, flush=True); time.sleep(0.02)\n"
        "t = threading.Thread(target=chatter); t.start(); t.join()\n"
        "print('joined', flush=True)\n"
    )
    cell = kernel.execute(code)
    kernel.wait_for_text(cell, "tick")
    kernel.send_steer(comm_id, {"type": "steer", "kind": "checkpoint"})
    messages = kernel.messages(cell)
    later = [m for m in messages if m["msg_type"] == "stream" and "later" in m["content"]["text"]]
    assert later, "the thread printed after the request"
    strays = [m for m in later if m["parent_header"].get("msg_id") != cell]
    assert not strays, "a thread's output left its cell after a steering message"
    assert stdout(messages, cell).count("later") == 5
    assert "joined" in stdout(messages, cell)
