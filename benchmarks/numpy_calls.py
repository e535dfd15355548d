"""Counting the numpy calls each health rule makes per pass: a figure that does not depend on
the machine's load (``benchmarks/health_cost.py --calls``,
``tests/health/test_rules_cost_counted.py``).

Numpy's per-call overhead (a few µs: argument parsing, dispatch, a new array) is most of what
a rule costs on a slice of 16 steps, so the count is what the health stage's CPU follows.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import numpy as np

from nbmonitor.health import Health


class NumpyCalls:
    """Counts numpy calls (functions of numpy's modules, ufuncs, array methods) through the
    interpreter's profile hook, per rule (``count_numpy`` sets ``rule`` while one runs); a
    numpy function calling others counts once."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.rule = ""

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.rule:
            return
        if event == "c_call":
            if "/numpy/" in frame.f_code.co_filename:
                return  # numpy's Python calling its C: counted as the Python call
            owner = getattr(arg, "__self__", None)
            module = getattr(arg, "__module__", None) or type(owner).__module__ or ""
            if not (module.startswith("numpy") or isinstance(owner, np.ndarray | np.ufunc)):
                return
        elif event == "call":
            code = frame.f_code
            if "/numpy/" not in code.co_filename or frame.f_back is None:
                return
            if code.co_name.endswith("_dispatcher"):
                return  # the dispatch of a numpy function, counted as that function
            if "/numpy/" in frame.f_back.f_code.co_filename:
                return  # numpy calling itself: one call from the rule's side
        else:
            return
        self.counts[self.rule] = self.counts.get(self.rule, 0) + 1


def count_numpy(health: Health, counter: NumpyCalls) -> None:
    """Count each of ``health``'s rules' numpy calls in its ``check`` into ``counter``."""
    for rule in health.rules:
        inner = rule.check

        def check(view: Any, inner: Any = inner, name: str = rule.name) -> Any:
            counter.rule = name
            sys.setprofile(counter)
            try:
                return inner(view)
            finally:
                sys.setprofile(None)
                counter.rule = ""

        rule.check = check  # type: ignore[method-assign]


__all__ = ["NumpyCalls", "count_numpy"]
