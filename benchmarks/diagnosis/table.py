"""``python -m benchmarks.diagnosis.table``: the table of every cause nbmonitor names, written
into docs/diagnosis.md from the code: each rule's ``doc`` (``nbmonitor.health.doc.RuleDoc``),
the symptoms it explains (its ``explains``), and the scenarios that test it (the ``rules`` of
the scenarios in ``benchmarks/diagnosis`` and ``tests/diagnosis/corpus``, the tuning part; the
held-back part is never read here). ``--check`` only says whether the file is up to date
(exit 1 if not); ``tests/diagnosis/test_docs_table.py`` runs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nbmonitor.health import RULES, Thresholds
from nbmonitor.health.doc import CAUSE, FINDING, SYMPTOM, RuleDoc
from nbmonitor.health.rule import RuleFactory, doc_of, explains_of

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "diagnosis.md"
BEGIN = "<!-- causes table: python -m benchmarks.diagnosis.table (written from the code) -->"
END = "<!-- end of the causes table -->"

# Rule registries besides RULES (each rule in them needs a doc), as "module:NAME".
REGISTRIES = (
    "nbmonitor.health.rules.devices:DEVICE_RULES",
    "nbmonitor._engine.derive.job_report:STEP_RULES",
    "nbmonitor._engine.derive.job_report:NOW_RULES",
)
# Alerts raised outside the health rules (at attach, by the engine): their modules' DOCS.
ELSEWHERE = (
    "nbmonitor.live.setup_check:DOCS",
    "nbmonitor._engine.assemble.flow_alerts:DOCS",
    "nbmonitor.health.rules.gradients:DOCS",
)
# Where the scenarios are: (module, tuple names); a module not there yet is left out.
SCENARIOS = (
    ("benchmarks.diagnosis.broken", ("BROKEN",)),
    ("benchmarks.diagnosis.healthy", ("HEALTHY",)),
    ("tests.diagnosis.corpus", ("BROKEN", "GPU_ONLY", "HEALTHY")),
)
KIND_TITLES = {
    CAUSE: "Causes: what the user did",
    SYMPTOM: "Symptoms: the last resort, when no cause explains them",
    FINDING: "Findings about the machine, the data pipeline and the job",
}


@dataclass(frozen=True)
class Entry:
    rule: str
    doc: RuleDoc | None
    explains: tuple[str, ...] = ()


def _load(spec: str) -> object:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def entries() -> list[Entry]:
    """Every rule of every registry (RULES first), then the alerts raised elsewhere, once each."""
    thresholds = Thresholds()
    factories: list[RuleFactory] = list(RULES)
    for spec in REGISTRIES:
        factories += list(_load(spec))  # type: ignore[call-overload]
    seen: dict[str, Entry] = {}
    for factory in factories:
        rule = factory(thresholds)
        if rule.name not in seen:
            seen[rule.name] = Entry(rule.name, doc_of(rule), explains_of(rule))
    for spec in ELSEWHERE:
        docs = _load(spec)
        assert isinstance(docs, dict), spec
        for name, doc in docs.items():
            seen.setdefault(name, Entry(name, doc))
    return list(seen.values())


def scenarios() -> Iterator[tuple[str, tuple[str, ...], bool]]:
    """(name, rules, gpu) of every scenario found (healthy ones have no rules)."""
    for module, names in SCENARIOS:
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        for name in names:
            for scenario in getattr(found, name, ()):
                yield scenario.name, tuple(scenario.rules), bool(getattr(scenario, "gpu", False))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _names(names: Iterable[str], limit: int = 6) -> str:
    names = list(names)
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def table() -> str:
    """The generated part of docs/diagnosis.md."""
    rows = entries()
    tested: dict[str, list[str]] = {}
    healthy: list[str] = []
    for name, rules, gpu in scenarios():
        if not rules:
            healthy.append(name)
        for rule in dict.fromkeys(rules):
            tested.setdefault(rule, []).append(name + (" (GPU)" if gpu else ""))
    by_kind: dict[str, list[Entry]] = {kind: [] for kind in KIND_TITLES}
    for entry in rows:
        if entry.doc is not None:
            by_kind[entry.doc.kind].append(entry)
    out = [BEGIN, ""]
    out.append(
        "Every alert nbmonitor raises, written from each rule's own documentation (its `doc`) "
        "and the scenarios that test it. A cause alert takes in the symptoms it explains: they "
        "are listed in its evidence, not raised on their own. "
        f"Healthy runs every rule must stay silent on: {len(healthy)} "
        f"({_names(sorted(healthy), 8)})."
    )
    for kind, title in KIND_TITLES.items():
        out += ["", f"### {title}", ""]
        out.append(
            "| rule | what it names | evidence it reads | fix | explains | silent on | tested by |"
        )
        out.append("|---|---|---|---|---|---|---|")
        for e in by_kind[kind]:
            assert e.doc is not None
            out.append(
                "| "
                + " | ".join(
                    [
                        f"`{e.rule}`",
                        _cell(e.doc.names),
                        _cell(e.doc.evidence),
                        _cell(e.doc.fix),
                        _names(e.explains, 10) if e.explains else "",
                        _cell("; ".join(e.doc.silent_on)),
                        _names(tested.get(e.rule, ()), 4),
                    ]
                )
                + " |"
            )
    known = {e.rule for e in rows}
    awaited = sorted(r for r in tested if r not in known)
    if awaited:
        out += [
            "",
            f"Named by scenarios, raised by no rule yet: {_names(awaited, 40)}.",
        ]
    out += ["", END]
    return "\n".join(out)


def missing_docs() -> list[str]:
    """The registered rules that have no ``doc``."""
    return [e.rule for e in entries() if e.doc is None]


def written(text: str, generated: str) -> str:
    """``text`` (docs/diagnosis.md) with its generated part replaced (added after the first
    section's opening paragraphs if it has none)."""
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        return head + generated + tail
    marker = "\n## "
    at = text.find(marker)
    if at < 0:
        return text.rstrip("\n") + "\n\n## The causes nbmonitor names\n\n" + generated + "\n"
    return text[:at] + "\n## The causes nbmonitor names\n\n" + generated + "\n" + text[at:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnosis.table")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/diagnosis.md is stale")
    args = parser.parse_args(argv)
    lacking = missing_docs()
    if lacking:
        print(f"rules without a doc (RuleDoc): {', '.join(lacking)}", file=sys.stderr)
        return 1
    text = DOC.read_text(encoding="utf-8")
    new = written(text, table())
    if args.check:
        if new != text:
            print(
                f"{DOC} is out of date: run python -m benchmarks.diagnosis.table", file=sys.stderr
            )
            return 1
        return 0
    if new != text:
        DOC.write_text(new, encoding="utf-8")
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
