"""Shared fixtures: every test must leave no nbmonitor thread behind."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator

import pytest

# One intra-op thread for torch here and in every process the tests start (kernels, torchrun,
# CLI runs inherit it): the tests' models are tiny and gain nothing from more, and beside
# another CPU-bound process torch's spinning worker threads slow each step 20-30x (measured on
# the 2-core CI box: 40 ms against 0.9-1.4 s), which turned timing verdicts upside down.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): set it there too
    sys.modules["torch"].set_num_threads(1)


def _nbmonitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("nbmonitor-") and t.is_alive()]


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(_nbmonitor_threads())
    yield
    # Threads still ending (a close on another thread) get a generous bound: a loaded machine
    # only lengthens the wait.
    deadline = time.monotonic() + 120.0
    leaked = [t for t in _nbmonitor_threads() if t not in before]
    while leaked and time.monotonic() < deadline:
        time.sleep(0.02)
        leaked = [t for t in _nbmonitor_threads() if t not in before]
    assert not leaked, f"test left nbmonitor threads alive: {[t.name for t in leaked]}"
