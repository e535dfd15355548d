"""Run every diagnosis scenario (full variants) and rewrite the score table in
docs/diagnosis.md.

    python3 -m benchmarks.diagnosis            # full variants, rewrites the table
    python3 -m benchmarks.diagnosis --fast     # the CI variants, prints only
    python3 -m benchmarks.diagnosis lr_zero cnn   # some scenarios, prints only
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from collections import Counter
from pathlib import Path

import torch
from benchmarks.diagnosis.broken import BROKEN
from benchmarks.diagnosis.harness import TARGET_STEPS, Score, run
from benchmarks.diagnosis.healthy import HEALTHY

DOC = Path(__file__).resolve().parents[2] / "docs" / "diagnosis.md"
BEGIN = "<!-- scenario table: python3 -m benchmarks.diagnosis -->"
END = "<!-- end of scenario table -->"


def _others(score: Score) -> str:
    counts = Counter(a.rule for a in score.others)
    return ", ".join(f"{rule}" + (f" x{n}" if n > 1 else "") for rule, n in counts.items())


def broken_table(scores: list[Score]) -> list[str]:
    lines = [
        "| run | bug | expected rule (layer) | found | steps to alert | also raised |",
        "|---|---|---|---|---|---|",
    ]
    for sc in scores:
        s = sc.scenario
        expect = f"`{s.rules[0]}`" + (f" (`{s.layer}`)" if s.layer else "")
        if len(s.rules) > 1:
            expect += " or " + ", ".join(f"`{r}`" for r in s.rules[1:])
        found = f"yes, `{sc.hit.rule}`" if sc.hit is not None else "**no**"
        delay = "-" if sc.delay is None else str(sc.delay)
        if sc.delay is not None and sc.delay > TARGET_STEPS:
            delay += f" ({s.why_late})" if s.why_late else " **late**"
        lines.append(f"| {s.name} | {s.what} | {expect} | {found} | {delay} | {_others(sc)} |")
    return lines


def healthy_table(scores: list[Score]) -> list[str]:
    lines = [
        "| run | family | setup | steps | final loss | alerts |",
        "|---|---|---|---|---|---|",
    ]
    for sc in scores:
        s = sc.scenario
        alerts = ", ".join(a.rule for a in sc.alerts) or "0"
        loss = f"{sc.final_loss:.1e}" if math.isfinite(sc.final_loss) else "nan"
        lines.append(f"| {s.name} | {s.family} | {s.what} | {sc.steps} | {loss} | {alerts} |")
    return lines


def summary(broken: list[Score], healthy: list[Score]) -> list[str]:
    found = sum(sc.found for sc in broken)
    in_time = sum(sc.in_time for sc in broken)
    alarms = sum(len(sc.alerts) for sc in healthy)
    return [
        f"Broken runs named by the right rule and layer: {found} of {len(broken)}; within "
        f"{TARGET_STEPS} steps of the bug: {in_time} of {len(broken)}. Alerts on "
        f"{len(healthy)} healthy runs ({sum(sc.steps for sc in healthy)} steps in all): "
        f"{alarms}.",
    ]


def render(broken: list[Score], healthy: list[Score]) -> str:
    lines = [
        BEGIN,
        "",
        *summary(broken, healthy),
        "",
        *broken_table(broken),
        "",
        *healthy_table(healthy),
        "",
        f"Default thresholds, CPU, torch {torch.__version__}, Python "
        f"{platform.python_version()}; each run attaches a monitor with interval "
        "0.05 s and reads its alerts back after close.",
        "",
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="only these scenarios (prints only)")
    parser.add_argument("--fast", action="store_true", help="the CI variants (prints only)")
    args = parser.parse_args(argv)
    picked = set(args.names)
    broken, healthy = [], []
    for group, out in ((BROKEN, broken), (HEALTHY, healthy)):
        for scenario in group:
            if picked and scenario.name not in picked:
                continue
            score = run(scenario, fast=args.fast)
            out.append(score)
            mark = "ok " if score.ok else "BAD"
            print(
                f"{mark} {scenario.name:24s} {score.steps:5d} steps {score.seconds:6.1f} s  "
                f"found={score.found} delay={score.delay} alerts="
                f"{[(a.rule, a.step) for a in score.alerts]}",
                flush=True,
            )
    table = render(broken, healthy)
    if picked or args.fast:
        print(table)
        return 0
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + table + tail if rest else text.rstrip("\n") + "\n\n" + table + "\n")
    print(f"wrote {DOC}")
    return 0 if all(sc.ok for sc in broken + healthy) else 1


if __name__ == "__main__":
    sys.exit(main())
