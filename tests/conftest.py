"""Shared fixtures: every test must leave no nbmonitor thread behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest


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
