"""The ``Rule`` protocol every rule meets, and the ``Outcome`` it returns.

A rule *holds* for a set of subjects (a layer name, a module name, a device, or ``""`` for
the whole run); it does not decide whether to alert. ``Health`` does that once for all rules:
an alert is raised when a subject starts to hold and not again while it keeps holding, and
re-armed only after the rule judged it clear for ``rearm_steps`` steps. So a rule is a pure
verdict plus whatever run-wide state its statistics need (a running maximum, a streak).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nbmonitor.health.alert import Alert
from nbmonitor.health.doc import RuleDoc
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthView


@dataclass(frozen=True)
class Outcome:
    """One rule's verdict on the new data."""

    rule: str
    held: Sequence[str]  # subjects for which the rule holds now
    # Whether a subject was judged (held or clear) this time. ``Health`` asks it only for the
    # subjects of an open episode (rarely any), so a rule that cannot hold may leave the
    # verdict it would take to answer it to the call.
    judged: Callable[[str], bool]
    make: Callable[[list[str]], list[Alert]]  # alerts for the subjects that newly hold
    # The subjects are parts of one model (layers) whose condition spreads from one to the
    # next: subjects that join soon after an alert are the same episode (``Health._settle``).
    # Devices, ranks and the run as a whole are each a problem of their own.
    spreads: bool = False


@runtime_checkable
class Rule(Protocol):
    """One alert rule. ``name`` is the ``Alert.rule`` it raises; ``check`` judges the new data
    of one check and returns an ``Outcome`` named ``name``; ``reset`` forgets run-wide state
    (``Health.reset``). Built from the ``Thresholds`` (see ``rules.RULES``)."""

    name: str

    def check(self, view: HealthView) -> Outcome: ...

    def reset(self) -> None: ...


# What rules.RULES lists: a rule class, or anything else that builds one from the thresholds.
RuleFactory = Callable[[Thresholds], Rule]


class Base:
    """What most rules share: the thresholds, and no run-wide state to reset.

    ``explains``: the rules whose alerts this one's explains (a cause's symptoms; ``Health``
    folds them into its alert, ``differential.py``). ``doc``: its entry in the table of causes
    (``doc.RuleDoc``; every registered rule has one)."""

    name = ""
    explains: tuple[str, ...] = ()
    doc: RuleDoc | None = None

    def __init__(self, thresholds: Thresholds) -> None:
        self.thresholds = thresholds

    def reset(self) -> None:
        """Nothing to forget; rules with run-wide state override this."""


def never(_: str) -> bool:
    return False


def always(_: str) -> bool:
    return True


def no_alerts(_new: list[str]) -> list[Alert]:
    """The ``make`` of an outcome that holds for no subject (never called)."""
    return []


@functools.cache
def nothing(rule: str) -> Outcome:
    """Nothing judged: no subject held, none cleared (no new data, or too little of it). One
    outcome per rule, made once: most rules say this on most passes."""
    return Outcome(rule, (), never, no_alerts)


@functools.cache
def clear(rule: str) -> Outcome:
    """Judged, and no subject holds: every subject the rule raised is clear (one per rule)."""
    return Outcome(rule, (), always, no_alerts)


def explains_of(rule: object) -> tuple[str, ...]:
    """The rules whose alerts ``rule`` explains (its ``explains``; none if it has none)."""
    names = getattr(rule, "explains", ())
    if not isinstance(names, tuple | list) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{type(rule).__name__}.explains must be a tuple of rule names.")
    return tuple(names)


def doc_of(rule: object) -> RuleDoc | None:
    """The rule's ``doc`` (None if it has none)."""
    doc = getattr(rule, "doc", None)
    return doc if isinstance(doc, RuleDoc) else None


__all__ = [
    "Base",
    "Outcome",
    "Rule",
    "RuleFactory",
    "always",
    "clear",
    "doc_of",
    "explains_of",
    "never",
    "no_alerts",
    "nothing",
]
