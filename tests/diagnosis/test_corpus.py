"""The diagnosis corpus of issue 42, tuning part (tests/diagnosis/corpus): broken runs drawn
from public reports, healthy runs of varied kinds, each a real monitor on a real tiny model.

A broken run passes when one alert of an accepted rule (naming the scenario's layer, when it
has one) is raised; a healthy run passes when it raises no alert and trained. The summary
prints the table and holds the corpus to issue 42's bar: named in >= 90 % of the broken runs,
no alert on any healthy run.

Each run must also reproduce its bug's own signal (or, healthy, train): a scenario that no
longer shows what its source reports says nothing about the rules.
"""

from __future__ import annotations

import pytest
import torch
from benchmarks.diagnosis.broken import BROKEN as OLD_BROKEN
from benchmarks.diagnosis.harness import Scenario
from benchmarks.diagnosis.healthy import HEALTHY as OLD_HEALTHY
from tests.diagnosis.corpus import BROKEN, GPU_ONLY, HEALTHY
from tests.diagnosis.corpus.scoring import NAMED_SHARE, alerts, score, table


def test_the_corpus_has_what_the_issue_asks() -> None:
    assert len(BROKEN) >= 22 and len(HEALTHY) >= 10
    new = [s.name for s in (*BROKEN, *GPU_ONLY, *HEALTHY)]
    names = [s.name for s in (*OLD_BROKEN, *OLD_HEALTHY)] + new
    assert len(set(names)) == len(names)
    # No new name starts another name or is started by one: ``-k name`` selects one scenario.
    clashes = [(a, b) for a in names for b in names if a != b and b.startswith(a)]
    assert [(a, b) for a, b in clashes if a in new or b in new] == []
    for s in (*BROKEN, *GPU_ONLY):
        assert s.rules and s.source and s.signal and s.check is not None, s.name
    for s in HEALTHY:
        assert not s.rules and s.check is not None, s.name
    assert all(s.gpu for s in GPU_ONLY) and not any(s.gpu for s in (*BROKEN, *HEALTHY))


@pytest.mark.parametrize("scenario", BROKEN, ids=lambda s: s.name)
def test_broken_run_is_named(scenario: Scenario) -> None:
    sc = score(scenario)
    assert sc.reproduced == "", f"the bug did not show its own signal: {sc.reproduced}"
    assert sc.found, f"{scenario.rules} naming {scenario.layer!r} not raised: {alerts(sc)}"


@pytest.mark.parametrize("scenario", HEALTHY, ids=lambda s: s.name)
def test_healthy_run_raises_no_alert(scenario: Scenario) -> None:
    sc = score(scenario)
    assert sc.reproduced == "", sc.reproduced  # it trained
    assert [(a.rule, a.step, a.message) for a in sc.alerts] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scenario", GPU_ONLY, ids=lambda s: s.name)
def test_gpu_broken_run_is_named(scenario: Scenario) -> None:
    sc = score(scenario)
    assert sc.reproduced == "", f"the bug did not show its own signal: {sc.reproduced}"
    assert sc.found, f"{scenario.rules} naming {scenario.layer!r} not raised: {alerts(sc)}"


# Alone (``-k summary``) it runs every scenario itself: minutes, not the default 120 s.
@pytest.mark.timeout(900)
def test_summary(capsys: pytest.CaptureFixture[str]) -> None:
    scores = [score(s) for s in (*BROKEN, *HEALTHY)]
    with capsys.disabled():
        print("\n\ndiagnosis corpus, tuning part\n" + table(scores))
    assert [sc.scenario.name for sc in scores if sc.reproduced] == []
    broken = [sc for sc in scores if not sc.scenario.healthy]
    assert sum(sc.found for sc in broken) >= NAMED_SHARE * len(broken)
    assert [sc.scenario.name for sc in scores if sc.scenario.healthy and sc.alerts] == []
