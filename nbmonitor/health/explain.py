"""``explain``: what an alert says, as one typed object: the cause, the evidence, the place and
the fix, and how it links to the other alerts of the run (the symptoms it took in, or the cause
that took it in). The same for a live monitor (``mon.explain``) and a run read from disk
(``nbmonitor.open(path).explain``), since both hold the same alerts (``Alert.to_record`` /
``from_record``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nbmonitor.health.alert import Alert, Explained
from nbmonitor.health.differential import SYMPTOMS
from nbmonitor.health.evidence import Evidence, text
from nbmonitor.health.wording import name_list

# What ``explain`` accepts to pick an alert.
Which = Alert | int | str | None


@dataclass(frozen=True)
class Explanation:
    """One alert explained. ``kind`` is ``"cause"`` (it names what the user did) or
    ``"symptom"`` (what was seen; no cause was supported). ``place`` is where: the alert's
    ``place``, else its layers listed, else its subject. ``symptoms`` are the symptom alerts
    it took in (``explains``); ``explained_by`` the cause alert that took this one in, if a
    later one did (its rule and step)."""

    rule: str
    kind: str
    severity: str
    step: int
    cause: str
    evidence: Evidence = field(hash=False)
    place: str
    layers: tuple[str, ...]
    fix: str
    message: str
    symptoms: tuple[Explained, ...] = ()
    explained_by: Explained | None = None

    def to_dict(self) -> dict[str, Any]:
        """The explanation as plain data (JSON-able)."""
        return {
            "rule": self.rule,
            "kind": self.kind,
            "severity": self.severity,
            "step": self.step,
            "cause": self.cause,
            "evidence": self.evidence,
            "place": self.place,
            "layers": list(self.layers),
            "fix": self.fix,
            "message": self.message,
            "symptoms": [list(s) for s in self.symptoms],
            "explained_by": list(self.explained_by) if self.explained_by else None,
        }

    def __str__(self) -> str:
        head = self.cause if self.kind == "cause" else f"Symptom: {self.message}"
        lines = [f"{self.rule} at step {self.step} ({self.severity}): {head}"]
        if self.place:
            lines.append(f"  where:    {self.place}")
        for key, value in self.evidence.items():
            if key != SYMPTOMS:
                lines.append(f"  evidence: {key.replace('_', ' ')} = {text(value)}")
        for rule, step in self.symptoms:
            lines.append(f"  explains: the {rule} alert at step {step}")
        if self.explained_by is not None:
            lines.append(
                f"  explained by: the {self.explained_by[0]} alert at step {self.explained_by[1]}"
            )
        if self.fix:
            lines.append(f"  fix:      {self.fix}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def explanation(alert: Alert, alerts: Sequence[Alert] = ()) -> Explanation:
    """``alert`` explained, linked to the other ``alerts`` of its run."""
    if alert.place:
        place = alert.place
    elif alert.layers:
        place = name_list(list(alert.layers))
    else:
        place = "" if alert.subject == "run" else alert.subject
    by = next(
        ((a.rule, a.step) for a in alerts if (alert.rule, alert.step) in a.explains),
        None,
    )
    return Explanation(
        rule=alert.rule,
        kind="cause" if alert.cause else "symptom",
        severity=alert.severity,
        step=alert.step,
        cause=alert.cause,
        evidence=alert.evidence,
        place=place,
        layers=alert.layers,
        fix=alert.fix,
        message=alert.message,
        symptoms=alert.explains,
        explained_by=by,
    )


def pick(alerts: Sequence[Alert], which: Which, where: str = "explain") -> Alert:
    """The alert ``which`` names among ``alerts``: an ``Alert`` (itself), an index into them
    (``-1``: the newest), a rule name (the newest alert of that rule) or None (the newest
    alert). ``LookupError`` or ``TypeError``, one line, for anything else."""
    if isinstance(which, Alert):
        return which
    if not alerts:
        raise LookupError(f"nbmonitor {where}: the run has raised no alert yet.")
    if which is None:
        return alerts[-1]
    if isinstance(which, bool) or not isinstance(which, int | str):
        raise TypeError(
            f"nbmonitor {where}: expected an Alert, an index or a rule name, got "
            f"{type(which).__name__}."
        )
    if isinstance(which, int):
        if not -len(alerts) <= which < len(alerts):
            raise LookupError(
                f"nbmonitor {where}: no alert {which}: the run has {len(alerts)} "
                f"(0 to {len(alerts) - 1}, or -1 for the newest)."
            )
        return alerts[which]
    for alert in reversed(alerts):
        if alert.rule == which:
            return alert
    raised = name_list(list(dict.fromkeys(a.rule for a in alerts)))
    raise LookupError(f"nbmonitor {where}: no {which!r} alert; the run raised: {raised}.")


def explain(alerts: Sequence[Alert], which: Which = None, where: str = "explain") -> Explanation:
    """``pick`` the alert, then explain it against ``alerts``."""
    return explanation(pick(alerts, which, where), alerts)


__all__ = ["Explanation", "Which", "explain", "explanation", "pick"]
