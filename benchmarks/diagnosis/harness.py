"""Runs one diagnosis scenario through a real monitor and scores what it said.

A scenario trains a tiny torch model on the CPU with the bug it names (or none); the harness
attaches nbmonitor with its default thresholds, lets the sampler run on a short interval,
flushes, closes, and reads the alerts back: found (an alert of an expected rule naming the
expected layer), steps from the bug to that alert, and every other alert (on a healthy run,
each is a false alarm). A scenario may run beside competing CPU-bound processes (``load``),
as on a shared machine: the timing rules must stay silent on a healthy run there.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import nbmonitor
from nbmonitor.health import Alert

# How soon a bug must be named, in steps after it appears.
TARGET_STEPS = 50
# The sampler's interval in the scenarios: short, so checks land during the run as they
# would in a longer one (the rules judge in slices either way).
INTERVAL_S = 0.05

Attach = Callable[..., nbmonitor.Monitor]


@dataclass(frozen=True)
class Scenario:
    """One training run. ``train(steps, attach)`` builds the model and optimizer, calls
    ``attach(model, optimizer, **options)`` once and trains ``steps`` steps."""

    name: str
    family: str
    what: str  # the bug, or the healthy setup, in a few words
    train: Callable[[int, Attach], object]  # may return the run's own numbers, for ``check``
    steps: int  # the full variant
    fast_steps: int  # the CI variant
    rules: tuple[str, ...] = ()  # the rules that name the bug (first: the main one); () healthy
    layer: str | None = None  # a layer (parameter or module) the alert must name
    bug_step: int = 0  # the step after which the bug is present (0: from the start)
    why_late: str = ""  # why the bug cannot be named within TARGET_STEPS, when it cannot
    load: int = 0  # CPU-bound processes competing with the run (LOAD_PER_CORE: one per core)
    source: str = ""  # the public report of the bug or the pattern (URL or thread title)
    signal: str = ""  # what a careful human sees in the run that makes naming the cause fair
    # On what ``train`` returned, judged without the monitor: "" when the run showed its own
    # signal (a broken run reproduced its bug; a healthy run trained), else what was missing.
    check: Callable[[Any], str] | None = None
    gpu: bool = False  # needs a CUDA device

    @property
    def healthy(self) -> bool:
        return not self.rules


@dataclass
class Score:
    scenario: Scenario
    steps: int
    seconds: float
    final_loss: float
    alerts: list[Alert] = field(default_factory=list)
    hit: Alert | None = None  # the first alert that names the bug
    result: Any = None  # what the scenario's ``train`` returned (its own numbers)

    @property
    def reproduced(self) -> str:
        """ "" when the run showed its own signal (``Scenario.check``), else what was missing."""
        check = self.scenario.check
        return "" if check is None else check(self.result)

    @property
    def found(self) -> bool:
        return self.hit is not None

    @property
    def delay(self) -> int | None:
        """Steps from the bug to the alert that named it (0: named before it bit)."""
        if self.hit is None:
            return None
        return max(0, self.hit.step - self.scenario.bug_step)

    @property
    def in_time(self) -> bool:
        delay = self.delay
        return delay is not None and delay <= TARGET_STEPS

    @property
    def others(self) -> list[Alert]:
        """Alerts that are not about the bug (false alarms on a healthy run)."""
        expected = set(self.scenario.rules)
        return [a for a in self.alerts if a.rule not in expected]

    @property
    def ok(self) -> bool:
        s = self.scenario
        if s.healthy:
            return not self.alerts
        return self.found and (self.in_time or bool(s.why_late))


# ``Scenario.load`` for one busy process per core.
LOAD_PER_CORE = -1
BUSY = "while True: pass"


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """``processes`` CPU-bound processes (``LOAD_PER_CORE``: one per core) running while the
    block runs, stopped (by their ids) however it ends."""
    n = (os.cpu_count() or 1) if processes == LOAD_PER_CORE else processes
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in busy:
            proc.kill()
        for proc in busy:
            proc.wait()


def matches(alert: Alert, scenario: Scenario) -> bool:
    if alert.rule not in scenario.rules:
        return False
    return scenario.layer is None or scenario.layer in alert.layers


def run(scenario: Scenario, fast: bool = True, **extra: Any) -> Score:
    """Train ``scenario`` (its CI variant when ``fast``) under a monitor and score it."""
    steps = scenario.fast_steps if fast else scenario.steps
    monitors: list[nbmonitor.Monitor] = []
    with tempfile.TemporaryDirectory(prefix="nbmonitor-diagnosis-") as run_dir:

        def attach(model: torch.nn.Module, optimizer: Any = None, **options: Any) -> Any:
            options = {
                "run_dir": run_dir,
                "display": False,
                "interval": INTERVAL_S,
                "name": scenario.name,
                **extra,
                **options,
            }
            mon = nbmonitor.attach(model, optimizer, **options)
            monitors.append(mon)
            return mon

        torch.manual_seed(0)
        # One thread: tiny models gain nothing from more, and on a busy machine torch's
        # spinning worker threads slow every step many-fold.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        start = time.perf_counter()
        try:
            with cpu_load(scenario.load):
                result = scenario.train(steps, attach)
        finally:
            torch.set_num_threads(threads)
            for mon in monitors:
                mon.flush()
                mon.close()
        seconds = time.perf_counter() - start
    assert len(monitors) == 1, f"{scenario.name}: attach() called {len(monitors)} times"
    mon = monitors[0]
    alerts = mon.events()
    loss = mon.history().get("loss")
    final = float(loss[-1]) if loss is not None and loss.size else math.nan
    hits = [a for a in alerts if matches(a, scenario)]
    hit = min(hits, key=lambda a: a.step) if hits else None
    return Score(scenario, steps, seconds, final, alerts, hit, result)


__all__ = [
    "INTERVAL_S",
    "LOAD_PER_CORE",
    "TARGET_STEPS",
    "Attach",
    "Scenario",
    "Score",
    "cpu_load",
    "matches",
    "run",
]
