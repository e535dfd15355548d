"""``Health``: runs every rule over one check's view and turns verdicts into alerts, once
per episode.

A rule holds for a set of subjects (a layer name, a module name, a device, or ``""`` for the
whole run). An alert is raised when a subject starts to hold and not again while it keeps
holding; it is re-armed only once the rule has been judged clear for that subject for
``rearm_steps`` steps. Keying by single subject rather than by the whole layer set means a set
that grows or shrinks by one layer (noise around a threshold) does not raise a new alert for
the layers already reported.
"""

from __future__ import annotations

from collections.abc import Sequence

from nbmonitor.health.alert import Alert
from nbmonitor.health.rule import Outcome, Rule, RuleFactory
from nbmonitor.health.rules import RULES
from nbmonitor.health.slices import slices
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthInput, View


class Health:
    """Stateful alert rules over a monitor's recent data; one instance per monitor.

    >>> health = Health(Thresholds(explode_abs=1e3))  # doctest: +SKIP
    >>> for alert in health.check(inp): ...  # doctest: +SKIP
    """

    def __init__(
        self, thresholds: Thresholds | None = None, rules: Sequence[RuleFactory] = RULES
    ) -> None:
        self.thresholds = thresholds if thresholds is not None else Thresholds()
        self.rules: tuple[Rule, ...] = tuple(make(self.thresholds) for make in rules)
        self._last_step: float | None = None
        self._last_layer_step: float | None = None
        # (rule, subject) -> step from which it has been judged clear (None while it holds)
        self._active: dict[tuple[str, str], int | None] = {}

    def check(self, inp: HealthInput) -> list[Alert]:
        """Judge the data that arrived since the last call; return only the NEW alerts.

        Many new steps at once (a short run that ended before the first check, checks seconds
        apart) are judged in slices, in step order, as if checked every few dozen steps.
        """
        alerts: list[Alert] = []
        for part in slices(inp, self._last_step):
            alerts.extend(self._check(part))
        return alerts

    def _check(self, inp: HealthInput) -> list[Alert]:
        view = View(inp, self._last_step, self._last_layer_step, self.thresholds.window)
        alerts: list[Alert] = []
        for outcome in [rule.check(view) for rule in self.rules]:
            alerts.extend(self._settle(outcome, inp.step))
        if view.step_col.size:
            self._last_step = float(view.step_col[-1])
        if view.layer_step_col.size:
            self._last_layer_step = float(view.layer_step_col[-1])
        return alerts

    def reset(self) -> None:
        """Forget what was reported (every condition alerts again)."""
        self._active.clear()
        self._last_step = None
        self._last_layer_step = None
        for rule in self.rules:
            rule.reset()

    def _settle(self, outcome: Outcome, step: int) -> list[Alert]:
        rule = outcome.rule
        held = set(outcome.held)
        new = [s for s in outcome.held if (rule, s) not in self._active]
        for subject in held:
            self._active[(rule, subject)] = None
        for key, clear_since in list(self._active.items()):
            if key[0] != rule or key[1] in held or not outcome.judged(key[1]):
                continue
            since = step if clear_since is None else clear_since
            if step - since >= self.thresholds.rearm_steps:
                del self._active[key]
            else:
                self._active[key] = since
        return outcome.make(new) if new else []


__all__ = ["Health"]
