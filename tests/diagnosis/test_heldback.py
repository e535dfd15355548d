"""The diagnosis corpus of issue 42, held-back part (tests/diagnosis/heldback): runs the rules
were not tuned on, the same checks and table as test_corpus.py. Rule work does not run or read
these; they are run at the end to see whether the rules generalise.

Held to issue 42's bar as a part: every healthy run silent, and named in >= 90 % of the broken
runs (the summary), not each one: these runs measure how far the rules generalise, and the
table prints the ones missed.
"""

from __future__ import annotations

import pytest
import torch
from benchmarks.diagnosis.broken import BROKEN as OLD_BROKEN
from benchmarks.diagnosis.harness import Scenario
from benchmarks.diagnosis.healthy import HEALTHY as OLD_HEALTHY
from tests.diagnosis import corpus
from tests.diagnosis.corpus.scoring import NAMED_SHARE, alerts, score, table
from tests.diagnosis.heldback import BROKEN, GPU_ONLY, HEALTHY


def test_the_held_back_part_has_what_the_issue_asks() -> None:
    assert len(BROKEN) >= 15 and len(HEALTHY) >= 8
    new = [s.name for s in (*BROKEN, *GPU_ONLY, *HEALTHY)]
    tuning = [s.name for s in (*corpus.BROKEN, *corpus.GPU_ONLY, *corpus.HEALTHY)]
    names = [s.name for s in (*OLD_BROKEN, *OLD_HEALTHY)] + tuning + new
    assert len(set(names)) == len(names)
    clashes = [(a, b) for a in names for b in names if a != b and b.startswith(a)]
    assert [(a, b) for a, b in clashes if a in new or b in new] == []
    for s in (*BROKEN, *GPU_ONLY):
        assert s.rules and s.source and s.signal and s.check is not None, s.name
    for s in HEALTHY:
        assert not s.rules and s.check is not None, s.name
    # The same cause families as the tuning part.
    assert {s.family for s in BROKEN} == {s.family for s in corpus.BROKEN}


@pytest.mark.parametrize("scenario", BROKEN, ids=lambda s: s.name)
def test_held_back_broken_run_shows_its_bug(scenario: Scenario) -> None:
    # Whether it is named counts in the summary's share, printed with the table.
    sc = score(scenario)
    assert sc.reproduced == "", f"the bug did not show its own signal: {sc.reproduced}"


@pytest.mark.parametrize("scenario", HEALTHY, ids=lambda s: s.name)
def test_held_back_healthy_run_raises_no_alert(scenario: Scenario) -> None:
    sc = score(scenario)
    assert sc.reproduced == "", sc.reproduced
    assert [(a.rule, a.step, a.message) for a in sc.alerts] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scenario", GPU_ONLY, ids=lambda s: s.name)
def test_held_back_gpu_broken_run_is_named(scenario: Scenario) -> None:
    sc = score(scenario)
    assert sc.reproduced == "", f"the bug did not show its own signal: {sc.reproduced}"
    assert sc.found, f"{scenario.rules} naming {scenario.layer!r} not raised: {alerts(sc)}"


# Alone (``-k summary``) it runs every scenario itself: minutes, not the default 120 s.
@pytest.mark.timeout(900)
def test_held_back_summary(capsys: pytest.CaptureFixture[str]) -> None:
    scores = [score(s) for s in (*BROKEN, *HEALTHY)]
    with capsys.disabled():
        print("\n\ndiagnosis corpus, held-back part\n" + table(scores))
    assert [sc.scenario.name for sc in scores if sc.reproduced] == []
    broken = [sc for sc in scores if not sc.scenario.healthy]
    assert sum(sc.found for sc in broken) >= NAMED_SHARE * len(broken)
    assert [sc.scenario.name for sc in scores if sc.scenario.healthy and sc.alerts] == []
