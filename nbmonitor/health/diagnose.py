"""What rules build their alerts with: ``cause_alert`` for a cause (what the user did, its
evidence, its place and one fix) and ``symptom_alert`` for a symptom no cause explains.

Both write the one-line ``message`` from the same parts, so the console line, the dashboard
and ``mon.explain`` say the same thing; the parts stay on the alert as data.

>>> cause_alert(  # doctest: +SKIP
...     "zero_grad_missing",
...     cause="`optimizer.zero_grad()` is never called: gradients add up across steps",
...     said="grad norm 0.4 → 40 over 200 steps, growing with the step",
...     evidence={"grad_norm": [0.4, 40.0], "steps": [1, 200], "slope_per_step": 0.2},
...     fix="call `optimizer.zero_grad()` once per step, before `loss.backward()`",
...     step=200, time=t,
... )
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.evidence import evidence_of, text


def said_of(evidence: Mapping[str, object]) -> str:
    """The evidence in words when a rule gives none: ``key value; key value`` (five at most)."""
    data = evidence_of(evidence)
    return "; ".join(f"{k.replace('_', ' ')} {text(v)}" for k, v in list(data.items())[:5])


def _sentence(text_: str) -> str:
    text_ = text_.strip()
    if not text_:
        return ""
    text_ = text_[0].upper() + text_[1:]
    return text_ if text_.endswith((".", "!", "?")) else text_ + "."


def cause_alert(
    rule: str,
    *,
    cause: str,
    fix: str,
    step: int,
    time: float,
    evidence: Mapping[str, object] | None = None,
    said: str | None = None,
    layers: Sequence[str] = (),
    place: str = "",
    subject: str | None = None,
    severity: str = "warning",
) -> Alert:
    """An alert naming a cause. ``cause`` says what the user did, in their terms; ``said``
    the evidence in words (None: ``said_of(evidence)``; ``""``: the cause already says it);
    ``evidence`` the values, steps and layers as data (bounded by ``evidence.py``);
    ``layers`` the parameters or modules it names (the subject is then ``"layers"``) and
    ``place`` where it is when that is not a list of layers (a param group, a module path,
    "the loss"); ``fix`` the one thing to do.

    The message: ``<Cause> (<said>). <Fix>.``, one line."""
    return _alert(rule, cause, fix, step, time, evidence, said, layers, place, subject, severity)


def symptom_alert(
    rule: str,
    *,
    seen: str,
    hint: str,
    step: int,
    time: float,
    evidence: Mapping[str, object] | None = None,
    said: str | None = None,
    layers: Sequence[str] = (),
    place: str = "",
    subject: str | None = None,
    severity: str = "warning",
) -> Alert:
    """An alert for a symptom no cause explains (the last resort): ``seen`` what is seen,
    ``hint`` what to check or try. ``cause`` stays empty: the dashboard and ``explain`` say
    it is a symptom. The other parts as in ``cause_alert``."""
    alert = _alert(rule, seen, hint, step, time, evidence, said, layers, place, subject, severity)
    return dataclasses.replace(alert, cause="")


def _alert(
    rule: str,
    head: str,
    fix: str,
    step: int,
    time: float,
    evidence: Mapping[str, object] | None,
    said: str | None,
    layers: Sequence[str],
    place: str,
    subject: str | None,
    severity: str,
) -> Alert:
    data = evidence_of(evidence or {})
    said = said_of(data) if said is None else said
    head = head.strip().rstrip(".")
    message = f"{head[:1].upper()}{head[1:]}" + (f" ({said})" if said else "") + ". "
    message += _sentence(fix)
    if subject is None:
        subject = subjects.LAYERS if layers else subjects.RUN
    return Alert(
        rule,
        severity,
        message.strip(),
        int(step),
        float(time),
        tuple(layers),
        subject=subject,
        cause=head,
        evidence=data,
        place=place,
        fix=fix.strip().rstrip("."),
    )


__all__ = ["cause_alert", "said_of", "symptom_alert"]
