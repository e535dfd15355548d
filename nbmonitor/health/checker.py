"""``Health``: runs every rule over one check's view and turns verdicts into alerts, once
per episode.

A rule holds for a set of subjects (a layer name, a module name, a device, or ``""`` for the
whole run). An alert is raised when a subject starts to hold and not again while it keeps
holding; it is re-armed only once the rule has been judged clear for that subject for
``rearm_steps`` steps. Keying by single subject rather than by the whole layer set means a set
that grows or shrinks by one layer (noise around a threshold) does not raise a new alert for
the layers already reported.

A condition that spreads over a model's layers (``Outcome.spreads``: gradients vanishing layer
after layer, judged every 16 steps) would still raise an alert at every grid point for the
layers that joined since the last; so while a rule holds for subjects it has already reported,
subjects that join it within ``rearm_steps`` of its last alert are taken into that episode
without an alert of their own (they are named in the rule's next alert, with the subjects that
join after that window, if they still hold then).

The alerts of each judged slice are then sorted by the differential diagnosis
(``differential.py``): a cause that holds takes in the symptoms it declares it explains
(``explains``), and a symptom is raised on its own only when no open cause explains it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from nbmonitor.health.alert import Alert
from nbmonitor.health.differential import Differential
from nbmonitor.health.rule import Outcome, Rule, RuleFactory, never
from nbmonitor.health.rules import RULES
from nbmonitor.health.slices import cuts, until
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthInput, HealthView, new_from

# The grid points a check that fell far behind is judged at (see ``Health.check``).
THINNED = 8


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
        self._grid_time: float | None = None  # recorded time of the last grid point judged
        # Whether the last check left grid points for the next one (its budget was spent).
        self.behind = False
        # rule -> subject -> step from which it has been judged clear (None while it holds);
        # by rule, so that settling one rule's outcome reads only its own subjects
        self._active: dict[str, dict[str, int | None]] = {}
        # rule -> the step of its last alert (what a spreading condition's new subjects fold into)
        self._alerted: dict[str, int] = {}
        # rule -> subjects taken into its episode without an alert, in the order they joined
        self._unsaid: dict[str, list[str]] = {}
        self.differential = Differential(self.rules, self.thresholds.rearm_steps)

    @property
    def judged_step(self) -> float | None:
        """The newest step judged (None before the first): the next check must bring the steps
        after it (``check`` judges in bounded passes and may leave some for the next call)."""
        return self._last_step

    def check(
        self,
        inp: HealthInput,
        final: bool = True,
        budget_s: float = math.inf,
        thin_beyond: float = math.inf,
        between: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> list[Alert]:
        """Judge the data that arrived since the last call; return only the NEW alerts.

        The new steps are judged in slices that end at grid points fixed by the data
        (``slices.py``), oldest first, so the same run raises the same alerts at the same
        steps however its checks fell. With ``final`` (a run that closed, a flush, a run read
        from disk) the steps after the newest grid point are judged too; without, they wait
        for the next check. A call judges slices for about ``budget_s`` (wall time on
        ``clock``: while the rules run, the training thread waits for the GIL), at least two,
        calls ``between`` between two (the sampler hands the GIL over there), and leaves the
        rest to the next call (``behind``; ``judged_step`` says where it stopped).

        A check whose new steps span more than ``thin_beyond`` steps (a loop so fast that the
        checks fall behind: the caller would lose steps off its window) keeps up by judging
        them at fewer points (``THINNED``, evenly spread): every step is still judged, but
        at points that depend on how far behind it was.
        """
        col = inp.steps.get("step")
        if col is None or not len(col):
            return self._check(inp)
        steps = np.asarray(col, dtype=np.float64)
        times = inp.steps.get("time")
        first = new_from(steps, self._last_step)
        plan = cuts(steps, times, first, self._grid_time, final)
        self.behind = False
        if not plan:
            # No grid point reached: what is true now (system samples, other ranks) is still
            # judged, with no new steps (the step rules judge nothing).
            return self._check(until(inp, steps, first, first, now=True))
        if len(plan) > THINNED and steps[-1] - steps[first] > thin_beyond:
            keep = np.unique(np.linspace(0, len(plan) - 1, THINNED).round().astype(np.intp))
            plan = [plan[i] for i in keep.tolist()]
        alerts: list[Alert] = []
        spent = took = 0.0
        for i, cut in enumerate(plan):
            # The last slice of this call carries what is true now, so it is chosen before it
            # runs: the one after which another, as long as the one before, would overrun.
            last = i == len(plan) - 1 or (i > 0 and spent + 2 * took >= budget_s)
            self.behind = i < len(plan) - 1
            if i and between is not None:
                between()
            start = clock()
            alerts.extend(self._check(until(inp, steps, first, cut.end, now=last)))
            took = clock() - start
            spent += took
            if cut.grid and times is not None and len(times) == steps.size:
                when = float(times[cut.end - 1])
                self._grid_time = when if math.isfinite(when) else self._grid_time
            if last:
                break
            first = cut.end
        return alerts

    def _check(self, inp: HealthInput) -> list[Alert]:
        view = HealthView(inp, self._last_step, self._last_layer_step, self.thresholds.window)
        alerts: list[Alert] = []
        active = self._active
        for outcome in [rule.check(view) for rule in self.rules]:
            # What ``_settle`` returns at once for (most outcomes), without the call.
            if outcome.held or (active.get(outcome.rule) and outcome.judged is not never):
                alerts.extend(self._settle(outcome, inp.step))
        alerts = self.differential.sort(alerts, self._open)
        if view.step_col.size:
            self._last_step = float(view.step_col[-1])
        if view.layer_step_col.size:
            self._last_layer_step = float(view.layer_step_col[-1])
        return alerts

    def reset(self) -> None:
        """Forget what was reported (every condition alerts again)."""
        self._active.clear()
        self._alerted.clear()
        self._unsaid.clear()
        self.differential.reset()
        self._last_step = None
        self._last_layer_step = None
        self._grid_time = None
        self.behind = False
        for rule in self.rules:
            rule.reset()

    def note(self, alerts: Sequence[Alert]) -> None:
        """Alerts raised outside the rules (the engine's, the static checks'): a cause judged
        later takes in those it explains (``differential.py``)."""
        self.differential.note(alerts)

    def _open(self, alert: Alert) -> bool:
        """Whether the episode ``alert`` was raised for is still open: its rule still holds
        for one of its subjects, or has not been clear for ``rearm_steps`` yet."""
        active = self._active.get(alert.rule)
        if not active:
            return False
        # A rule held for the run as a whole (subject "") keeps open every alert it made,
        # whatever layers that alert names (a cause about the adapters holds for the run).
        return not alert.layers or "" in active or any(layer in active for layer in alert.layers)

    def _settle(self, outcome: Outcome, step: int) -> list[Alert]:
        rule = outcome.rule
        active = self._active.get(rule)
        if not outcome.held and (not active or outcome.judged is never):
            # Nothing holds, and nothing is waiting to be cleared (most rules) or nothing was
            # judged (no new data): no subject changes.
            return []
        if active is None:
            active = self._active[rule] = {}
        held = set(outcome.held)
        new = [s for s in outcome.held if s not in active]
        spreading = (
            outcome.spreads
            and new
            and len(new) < len(held)  # it already held for subjects reported before
            and step - self._alerted.get(rule, -math.inf) < self.thresholds.rearm_steps
        )
        active.update(dict.fromkeys(held))
        # Only the subjects that stopped holding can clear (none while every subject of the
        # episode still holds: a condition over a hundred layers, every pass).
        stopped = [s for s in active if s not in held] if len(active) > len(held) else []
        for subject in stopped:
            if not outcome.judged(subject):
                continue
            clear_since = active[subject]
            since = step if clear_since is None else clear_since
            if step - since >= self.thresholds.rearm_steps:
                del active[subject]
            else:
                active[subject] = since
        if not new:
            return []
        if spreading:
            unsaid_now = self._unsaid.setdefault(rule, [])
            unsaid_now.extend(s for s in new if s not in unsaid_now)
            return []
        unsaid = [s for s in self._unsaid.pop(rule, ()) if s in held and s not in new]
        self._alerted[rule] = step
        return outcome.make(unsaid + new)


__all__ = ["THINNED", "Health"]
