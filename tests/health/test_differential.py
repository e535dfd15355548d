"""The differential diagnosis (``health/differential.py``): a cause that holds takes in the
symptoms it explains, whichever is seen first; a symptom no cause explains stands alone."""

from __future__ import annotations

import dataclasses

import pytest
from tests.health.scripted import Scripted
from tests.health.synthetic import Run

from nbmonitor.health import Alert, Health, HealthInput
from nbmonitor.health.alert import LAYERS, RUN
from nbmonitor.health.differential import SYMPTOMS


def run_to(steps: int) -> HealthInput:
    run = Run()
    run.add(steps)
    return run.input(window=steps)


def judge(rules: list[Scripted], steps: int = 400, every: int | None = None) -> list[Alert]:
    health = Health(rules=[lambda _t, r=r: r for r in rules])  # type: ignore[misc]
    run = Run()
    run.add(steps)
    full = run.input(window=steps)
    if every is None:
        return health.check(full)
    alerts: list[Alert] = []
    for n in [*range(every, steps, every), steps]:
        keep = slice(0, n)
        inp = dataclasses.replace(
            full,
            step=n,
            steps={k: v[keep] for k, v in full.steps.items()},
            layer_steps=None,
            layer_grad_norms=None,
        )
        alerts += health.check(inp, final=n == steps)
    return alerts


def summary(alerts: list[Alert]) -> list[tuple[str, int, tuple[tuple[str, int], ...]]]:
    return [(a.rule, a.step, a.explains) for a in alerts]


def test_a_cause_and_its_symptom_in_the_same_slice_raise_the_cause_alone() -> None:
    alerts = judge(
        [Scripted("symptom", 50, 400), Scripted("cause", 50, 400, explains=("symptom",))]
    )
    assert summary(alerts) == [("cause", 50, (("symptom", 50),))]
    [cause] = alerts
    assert cause.is_cause and cause.cause == "cause happened" and cause.fix == "undo it"
    assert cause.evidence[SYMPTOMS] == [{"rule": "symptom", "step": 50, "evidence": {"value": 3.5}}]
    assert cause.evidence["norms"] == [1.0, 2.0]  # numpy made data


@pytest.mark.parametrize("order", ["symptom first", "cause first"])
def test_the_order_of_the_rules_does_not_matter(order: str) -> None:
    symptom, cause = Scripted("symptom", 50, 400), Scripted("cause", 50, 400, explains=("symptom",))
    rules = [symptom, cause] if order == "symptom first" else [cause, symptom]
    assert summary(judge(rules)) == [("cause", 50, (("symptom", 50),))]


def test_a_symptom_seen_before_its_cause_is_taken_in_by_it() -> None:
    alerts = judge(
        [Scripted("symptom", 20, 400), Scripted("cause", 150, 400, explains=("symptom",))]
    )
    # The symptom was raised on its own (no cause yet); the cause says it explains it.
    assert summary(alerts) == [("symptom", 20, ()), ("cause", 150, (("symptom", 20),))]
    assert not alerts[0].is_cause and alerts[0].fix == "check it"
    assert alerts[1].evidence[SYMPTOMS][0]["step"] == 20  # type: ignore[index]


def test_a_symptom_whose_episode_ended_long_before_is_not_taken_in() -> None:
    # Clear from 41 on, re-armed after rearm_steps (100): a different episode.
    alerts = judge(
        [Scripted("symptom", 20, 40), Scripted("cause", 300, 400, explains=("symptom",))]
    )
    assert summary(alerts) == [("symptom", 20, ()), ("cause", 300, ())]


def test_a_symptom_after_its_cause_is_not_raised() -> None:
    health_rules = [
        Scripted("cause", 20, 400, explains=("symptom",)),
        Scripted("symptom", 200, 400),
    ]
    alerts = judge(health_rules)
    assert summary(alerts) == [("cause", 20, ())]


def test_a_symptom_no_cause_explains_stands_alone() -> None:
    alerts = judge([Scripted("symptom", 60, 400), Scripted("cause", 60, 400, explains=("other",))])
    assert sorted(summary(alerts)) == [("cause", 60, ()), ("symptom", 60, ())]
    symptom = next(a for a in alerts if a.rule == "symptom")
    assert symptom.cause == "" and symptom.message == "Symptom seen (value 3.5). Check it."


def test_a_cause_on_some_layers_explains_symptoms_there_only() -> None:
    rules = [
        Scripted("cause", 50, 400, explains=("symptom",), subjects=("a",)),
        Scripted("symptom", 50, 400, subjects=("b",)),
    ]
    alerts = judge(rules)
    assert sorted(summary(alerts)) == [("cause", 50, ()), ("symptom", 50, ())]
    assert {a.subject for a in alerts} == {LAYERS}
    rules = [
        Scripted("cause", 50, 400, explains=("symptom",), subjects=("a",)),
        Scripted("symptom", 50, 400, subjects=("a", "b")),
    ]
    assert summary(judge(rules)) == [("cause", 50, (("symptom", 50),))]
    # A cause that names no layer explains the symptom wherever it is.
    rules = [
        Scripted("cause", 50, 400, explains=("symptom",)),
        Scripted("symptom", 50, 400, subjects=("b",)),
    ]
    [alert] = judge(rules)
    assert alert.subject == RUN and alert.explains == (("symptom", 50),)


@pytest.mark.parametrize("every", [1, 7, 16, 50, 400])
def test_the_same_run_sorts_the_same_however_it_is_checked(every: int) -> None:
    def rules() -> list[Scripted]:
        return [
            Scripted("symptom", 20, 400),
            Scripted("late", 100, 400),
            Scripted("cause", 150, 400, explains=("symptom", "late")),
        ]

    reference = judge(rules(), every=1)
    assert summary(reference) == [
        ("symptom", 20, ()),
        ("late", 100, ()),
        ("cause", 150, (("symptom", 20), ("late", 100))),
    ]
    assert summary(judge(rules(), every=every)) == summary(reference)


def test_reset_forgets_the_open_causes() -> None:
    cause = Scripted("cause", 1, 400, explains=("symptom",))
    symptom = Scripted("symptom", 1, 400)
    health = Health(rules=[lambda _t: cause, lambda _t: symptom])
    first = health.check(run_to(100))
    health.reset()
    assert summary(health.check(run_to(100))) == summary(first) == [("cause", 1, (("symptom", 1),))]


def test_a_cause_takes_in_the_alerts_raised_outside_the_rules_before_it() -> None:
    # The engine's grad_non_finite / gradient_not_flowing, the static checks: told to Health
    # (note) when raised; a cause judged later takes in those at or before its step and within
    # rearm_steps of it, and never holds them back.
    cause = Scripted("cause", 150, 400, explains=("outside",))
    health = Health(rules=[lambda _t: cause])
    outside = [
        Alert("outside", "error", "seen at 10", 10, 1.0),  # too long before (rearm_steps 100)
        Alert("outside", "error", "seen at 60", 60, 1.0, ("fc1.weight",)),
        Alert("outside", "error", "seen at 200", 200, 1.0),  # after the cause: not taken in
        Alert("other", "error", "not explained", 100, 1.0),
    ]
    health.note(outside)
    [alert] = health.check(run_to(400))
    assert alert.explains == (("outside", 60),)
    assert alert.evidence[SYMPTOMS] == [{"rule": "outside", "step": 60, "layers": ["fc1.weight"]}]
