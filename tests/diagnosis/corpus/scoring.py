"""Scoring a corpus part for its tests: each scenario run once per session (the summary reuses
the per-scenario runs), and the table the summary prints."""

from __future__ import annotations

import math

from benchmarks.diagnosis.harness import Scenario, Score, run

_SCORES: dict[str, Score] = {}

# Named by cause in at least this share of the broken runs (issue 42).
NAMED_SHARE = 0.9


def score(scenario: Scenario) -> Score:
    """The CI variant of ``scenario``, run once per test session."""
    if scenario.name not in _SCORES:
        _SCORES[scenario.name] = run(scenario, fast=True)
    return _SCORES[scenario.name]


def alerts(sc: Score) -> str:
    return ", ".join(
        f"{a.rule}@{a.step}" + (f"[{','.join(a.layers[:2])}]" if a.layers else "")
        for a in sc.alerts
    )


def table(scores: list[Score]) -> str:
    rows = [("scenario", "family", "expected (layer)", "named", "own signal", "alerts raised")]
    for sc in scores:
        s = sc.scenario
        expected = "none (healthy)" if s.healthy else "|".join(s.rules)
        if s.layer:
            expected += f" ({s.layer})"
        if s.healthy:
            named = "-" if not sc.alerts else "FALSE ALARM"
        else:
            named = "yes" if sc.found else "no"
        signal = "ok" if not sc.reproduced else "MISSING"
        rows.append((s.name, s.family, expected, named, signal, alerts(sc) or "0"))
    widths = [min(60, max(len(r[i]) for r in rows)) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
        for r in rows
    ]
    broken = [sc for sc in scores if not sc.scenario.healthy]
    healthy = [sc for sc in scores if sc.scenario.healthy]
    named = sum(sc.found for sc in broken)
    alarms = sum(len(sc.alerts) for sc in healthy)
    share = named / len(broken) if broken else math.nan
    lines.append(
        f"named by cause: {named} of {len(broken)} broken runs ({share:.0%}); alerts on "
        f"{len(healthy)} healthy runs: {alarms}"
    )
    return "\n".join(lines)
