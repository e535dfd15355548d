"""The diagnosis scenarios (benchmarks/diagnosis), CI variants: real monitors on real tiny
torch models. Every broken run is named by the right rule and layer within 50 steps of its
bug (or says why it cannot be), and no healthy run raises any alert at default thresholds.

``python3 -m benchmarks.diagnosis`` runs the full variants and rewrites the table in
docs/diagnosis.md.
"""

from __future__ import annotations

import pytest
from benchmarks.diagnosis.broken import BROKEN
from benchmarks.diagnosis.harness import TARGET_STEPS, Scenario, run
from benchmarks.diagnosis.healthy import HEALTHY


def test_the_suite_has_what_the_issue_asks() -> None:
    assert len(BROKEN) >= 15 and len({s.name for s in BROKEN}) == len(BROKEN)
    assert len(HEALTHY) >= 8 and len({s.family for s in HEALTHY}) >= 4
    # A long healthy run that converges runs in CI too.
    assert max(s.fast_steps for s in HEALTHY) >= 2000


@pytest.mark.parametrize("scenario", BROKEN, ids=lambda s: s.name)
def test_broken_run_is_named_in_time(scenario: Scenario) -> None:
    score = run(scenario, fast=True)
    detail = [(a.rule, a.step, a.layers[:3]) for a in score.alerts]
    assert score.found, f"{scenario.rules} naming {scenario.layer!r} not raised: {detail}"
    if scenario.why_late:
        assert score.delay is not None and score.delay > TARGET_STEPS  # else drop why_late
    else:
        assert score.in_time, f"named {score.delay} steps after the bug: {detail}"


@pytest.mark.parametrize("scenario", HEALTHY, ids=lambda s: s.name)
def test_healthy_run_raises_no_alert(scenario: Scenario) -> None:
    score = run(scenario, fast=True)
    assert [(a.rule, a.step, a.message) for a in score.alerts] == []
    assert score.final_loss < 0.1  # it trained
