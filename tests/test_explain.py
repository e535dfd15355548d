"""``mon.explain`` and ``nbmonitor.open(path).explain``: an alert's cause, evidence, place and
fix as data, the same live and read back from the run folder; ``events()`` the same type in
both (issue 37)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import torch
from tests.health.scripted import Scripted
from tests.helpers import mlp, train

import nbmonitor
import nbmonitor.live.monitor as monitor_module
import nbmonitor.runs
from nbmonitor.health import RULES, Alert, Health, Thresholds
from nbmonitor.health.differential import SYMPTOMS
from nbmonitor.health.explain import Explanation


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The monitor's rules plus a symptom that holds from step 20 and a cause that explains
    it from step 60 (a cause confirmed after its symptom was seen)."""

    def health(thresholds: Thresholds | None = None) -> Health:
        extra = (
            lambda t: Scripted("symptom", 20, 10**6, thresholds=t),
            lambda t: Scripted("cause", 60, 10**6, explains=("symptom",), thresholds=t),
        )
        return Health(thresholds, rules=(*RULES, *extra))

    monkeypatch.setattr(monitor_module, "Health", health)


def records(alerts: list[Alert]) -> str:
    return json.dumps([a.to_record() for a in alerts], sort_keys=True)


def test_an_alert_explains_itself_the_same_live_and_from_its_folder(
    tmp_path: pathlib.Path, scripted: None
) -> None:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False)
    try:
        train(model, opt, mon, 120)
    finally:
        mon.close()
    live = mon.events()
    assert [(a.rule, a.step) for a in live] == [("symptom", 20), ("cause", 60)]
    cause = mon.explain("cause")
    assert isinstance(cause, Explanation) and cause.kind == "cause"
    assert (cause.cause, cause.fix, cause.step) == ("cause happened", "undo it", 60)
    assert cause.symptoms == (("symptom", 20),)
    assert cause.evidence["first_step"] == 60
    assert cause.evidence[SYMPTOMS] == [{"rule": "symptom", "step": 20, "evidence": {"value": 3.5}}]
    symptom = mon.explain(0)
    assert symptom.kind == "symptom" and symptom.explained_by == ("cause", 60)
    assert "explained by: the cause alert at step 60" in str(symptom)
    assert "evidence: first step = 60" in str(cause) and "fix:      undo it" in str(cause)

    run = nbmonitor.open(mon.run_dir)
    disk = run.events()
    assert all(type(a) is Alert for a in [*live, *disk])  # the same type, live and from disk
    assert records(disk) == records(live) and disk == live
    for which in (None, 0, 1, -1, "symptom", "cause", live[1]):
        assert run.explain(which).to_dict() == mon.explain(which).to_dict(), which
    # The dict form of before still reads a field.
    assert [e["rule"] for e in disk] == ["symptom", "cause"] and disk[1]["explains"] == [
        ["symptom", 20]
    ]
    # The replayed dashboard holds the same alerts, evidence included.
    assert records(list(run.frame().alerts)) == records(list(mon.frame().alerts))


def test_explain_says_in_one_line_what_it_cannot_find(tmp_path: pathlib.Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        train(model, opt, mon, 5)
    run = nbmonitor.open(mon.run_dir)
    for explain, where in ((mon.explain, "mon.explain"), (run.explain, "run.explain")):
        with pytest.raises(
            LookupError, match=f"^nbmonitor {where}: the run has raised no alert yet.$"
        ):
            explain()
    alerts = [Alert("a", "warning", "m", 3, 1.0), Alert("b", "info", "n", 5, 2.0)]
    from nbmonitor.health.explain import explain as explain_in

    bad: list[tuple[Any, type[Exception], str]] = [
        (2, LookupError, "no alert 2: the run has 2 (0 to 1, or -1 for the newest)."),
        (-3, LookupError, "no alert -3"),
        ("c", LookupError, "no 'c' alert; the run raised: a, b."),
        (1.5, TypeError, "expected an Alert, an index or a rule name, got float."),
        (True, TypeError, "got bool"),
    ]
    for which, kind, said in bad:
        with pytest.raises(kind) as info:
            explain_in(alerts, which)
        assert said in str(info.value) and "\n" not in str(info.value)
    assert explain_in(alerts, "a").step == 3 and explain_in(alerts).rule == "b"
    assert explain_in(alerts, -2).rule == "a"


def test_a_hostile_events_file_reads_back_typed_and_bounded(tmp_path: pathlib.Path) -> None:
    from nbmonitor.sinks.runlog import RunLogSink

    log = RunLogSink.create(tmp_path, "hostile", {"model": "MLP"})
    huge = {f"k{i}": list(range(100)) for i in range(100)}
    deep: Any = 1
    for _ in range(20):
        deep = {"d": deep}
    log.write_events(
        [
            {
                "rule": "r",
                "step": 3,
                "time": 1.0,
                "evidence": huge,
                "cause": "c" * 10_000,
                "fix": "f" * 10_000,
                "place": "p" * 10_000,
                "explains": [["s", 1], "junk", [1, 2], ["t", "x"]],
                "layers": ["a"] * 10,
                "severity": "fatal",
                "subject": None,
            },
            {"rule": "r2", "evidence": deep, "explains": [["s", 2.0]] * 1000},
            {"rule": "r3", "evidence": "not an object"},  # skipped with a warning (line 3)
            {"rule": "r4", "fix": 5},  # skipped with a warning
            {"rule": "r5", "explains": {"s": 1}},  # skipped with a warning
            {"rule": "", "message": "no rule"},
        ]
    )
    log.close()
    run = nbmonitor.open(log.path)
    with pytest.warns(nbmonitor.runs.RunDataWarning) as caught:
        first, second = run.events()
    said = " ".join(str(w.message) for w in caught)
    assert "line 3: evidence is not an object" in said and "line 4: fix is not a string" in said
    assert "line 5: explains is not a list" in said and "1 record(s) with no rule skipped" in said
    assert len(first.evidence) == 32
    assert all(isinstance(v, list) and len(v) == 32 for v in first.evidence.values())
    assert (len(first.cause), len(first.fix), len(first.place)) == (500, 500, 200)
    assert first.explains == (("s", 1), ("t", 0)) and first.severity == "info"
    assert first.subject == "run" and first.layers == ("a",) * 10
    assert len(second.explains) == 32 and second.explains[0] == ("s", 2)
    text = json.dumps(second.evidence)
    assert text.count('"d"') == 5 and len(text) < 400  # the rest is a short repr
    with pytest.warns(nbmonitor.runs.RunDataWarning):
        assert run.explain("r").cause == first.cause
