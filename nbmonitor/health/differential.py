"""The differential diagnosis: a cause that holds takes in the symptoms it explains.

A cause rule declares the symptom rules it explains (``explains``: a forgotten ``zero_grad``
explains ``exploding_gradients`` and ``loss_plateau``). The alerts of one judged slice are
sorted here, after every rule has been settled, so the order of the rules does not matter:

- a cause alert takes in the alerts of the same slice it explains (they are not raised: they
  are listed in its evidence under ``"symptoms"`` and in its ``explains``);
- it also takes in a symptom it explains that was raised earlier and whose episode is still
  open (the symptom still holds, or has not been clear for ``rearm_steps``): symptoms are often
  seen before their cause is confirmed. That alert was already shown; the cause alert says it
  explains it (``explains``: its rule and step, as data), so the event log, ``explain`` and the
  dashboard link the two;
- while a cause's episode is open, a new symptom alert it explains is not raised at all;
- a symptom no open cause explains is raised as it is: the last resort.

Alerts raised outside the rules (the engine's ``grad_non_finite`` and
``gradient_not_flowing``, the static checks at attach) are told to it with ``note``: a cause
takes in those it explains whose step is at most its own and at most ``rearm_steps`` before it
(the engine finds them before the rules judge their step, so this does not depend on when the
checks ran); they are never held back, as they were raised already.

"Explains" is judged on the same place: a cause that names layers (``Alert.layers``) explains
symptoms on those layers (or on the run as a whole); a cause that names none explains them
anywhere in the run. Devices and ranks are each their own place. Everything depends only on
the slices judged (the grid, ``slices.py``), so the same run sorts the same way however its
checks fell.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

from nbmonitor.health.alert import Alert
from nbmonitor.health.evidence import EvidenceValue
from nbmonitor.health.rule import Rule, explains_of

# Recent alerts kept to be taken in or to take in later ones: far more than a run has open.
KEPT = 64
# Layers of a folded symptom listed in its cause's evidence.
LAYERS_LISTED = 8
SYMPTOMS = "symptoms"  # the evidence key folded symptoms are listed under


def _place_family(subject: str) -> str:
    for prefix in ("gpu", "rank"):
        if subject.startswith(prefix) and subject[len(prefix) :].isdigit():
            return prefix
    return ""


def covers(cause: Alert, symptom: Alert) -> bool:
    """Whether ``cause`` is about the place of ``symptom`` (see the module docstring)."""
    if cause.layers and symptom.layers and not set(cause.layers) & set(symptom.layers):
        return False
    family = _place_family(cause.subject)
    return not (
        family and family == _place_family(symptom.subject) and cause.subject != symptom.subject
    )


def folded(symptom: Alert) -> dict[str, EvidenceValue]:
    """What a cause's evidence keeps of a symptom it took in."""
    entry: dict[str, EvidenceValue] = {"rule": symptom.rule, "step": symptom.step}
    if symptom.layers:
        entry["layers"] = list(symptom.layers[:LAYERS_LISTED])
    if symptom.evidence:
        entry["evidence"] = dict(symptom.evidence)
    return entry


class Differential:
    """Sorts each slice's alerts into causes that take in their symptoms (``sort``)."""

    def __init__(self, rules: Sequence[Rule], rearm_steps: int = 100) -> None:
        self.rearm_steps = rearm_steps
        self.explains: dict[str, tuple[str, ...]] = {}
        for rule in rules:
            names = explains_of(rule)
            if names:
                self.explains[rule.name] = names
        self.explainable = frozenset(n for names in self.explains.values() for n in names)
        self.reset()

    def reset(self) -> None:
        # Alerts raised that a cause may still take in, and the causes raised, newest last.
        self._symptoms: collections.deque[Alert] = collections.deque(maxlen=KEPT)
        self._causes: collections.deque[Alert] = collections.deque(maxlen=KEPT)
        # Alerts raised outside the rules (``note``) that a cause may still take in.
        self._noted: collections.deque[Alert] = collections.deque(maxlen=KEPT)
        # (cause rule, symptom rule) -> symptom alerts not raised while the cause was open
        self.quieted: collections.Counter[tuple[str, str]] = collections.Counter()

    def note(self, alerts: Sequence[Alert]) -> None:
        """Alerts raised outside the rules, for a later cause to take in (see the module)."""
        self._noted.extend(a for a in alerts if a.rule in self.explainable)

    def _noted_for(self, cause: Alert) -> list[Alert]:
        return [
            a
            for a in self._noted
            if self.explained_by(cause, a) and 0 <= cause.step - a.step <= self.rearm_steps
        ]

    def explained_by(self, cause: Alert, symptom: Alert) -> bool:
        return symptom.rule in self.explains.get(cause.rule, ()) and covers(cause, symptom)

    def sort(self, made: Sequence[Alert], is_open: Callable[[Alert], bool]) -> list[Alert]:
        """The alerts of one slice (``made``, in the rules' order) to raise, in that order.
        ``is_open(alert)``: whether the episode an alert was raised for is still open."""
        if not self.explains or not made:
            self._remember(made)
            return list(made)
        out: list[Alert | None] = list(made)
        for i, alert in enumerate(made):
            raised = out[i]
            if alert.rule not in self.explains or raised is None:
                continue
            now: list[Alert] = []
            for j, other in enumerate(made):
                candidate = out[j]
                if j != i and candidate is not None and self.explained_by(alert, other):
                    now.append(candidate)
                    out[j] = None
            earlier = [s for s in self._symptoms if self.explained_by(raised, s) and is_open(s)]
            noted = self._noted_for(raised)
            out[i] = self._take_in(raised, now, earlier, noted)
        kept: list[Alert] = []
        for each in out:
            if each is None:
                continue
            cause = next(
                (c for c in self._causes if self.explained_by(c, each) and is_open(c)), None
            )
            if cause is not None:
                self.quieted[(cause.rule, each.rule)] += 1
                continue
            kept.append(each)
        self._remember(kept)
        return kept

    def _remember(self, raised: Sequence[Alert]) -> None:
        for alert in raised:
            if alert.rule in self.explainable:
                self._symptoms.append(alert)
            if alert.rule in self.explains:
                self._causes.append(alert)

    def _take_in(
        self, cause: Alert, now: list[Alert], earlier: list[Alert], noted: list[Alert]
    ) -> Alert:
        if not now and not earlier and not noted:
            return cause
        taken = sorted([*noted, *earlier], key=lambda a: a.step) + now
        for symptom in earlier:
            self._symptoms.remove(symptom)  # taken in once
        for symptom in noted:
            self._noted.remove(symptom)
        evidence = dict(cause.evidence)
        listed = evidence.get(SYMPTOMS)
        entries = list(listed) if isinstance(listed, list) else []
        evidence[SYMPTOMS] = entries + [folded(s) for s in taken]
        explains = cause.explains + tuple((s.rule, s.step) for s in taken)
        return dataclasses.replace(cause, evidence=evidence, explains=explains)


__all__ = ["KEPT", "SYMPTOMS", "Differential", "covers", "folded"]
