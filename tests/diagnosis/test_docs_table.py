"""docs/diagnosis.md's table of causes is written from the code (``benchmarks.diagnosis.table``):
it fails when the file is out of date or a registered rule has no doc."""

from __future__ import annotations

import pytest
from benchmarks.diagnosis import table

from nbmonitor.health import RULES
from nbmonitor.health.rule import Base


def test_the_table_of_causes_in_the_docs_is_up_to_date() -> None:
    assert table.missing_docs() == [], "give each of these rules a doc (nbmonitor.health.RuleDoc)"
    text = table.DOC.read_text(encoding="utf-8")
    assert table.written(text, table.table()) == text, (
        "docs/diagnosis.md is out of date: run python -m benchmarks.diagnosis.table"
    )
    assert table.main(["--check"]) == 0


def test_every_registered_rule_is_in_the_table_with_what_tests_it() -> None:
    generated = table.table()
    for entry in table.entries():
        assert f"| `{entry.rule}` |" in generated, entry.rule
    # The scenarios' rules fields are read: a rule a broken scenario names is "tested by" it.
    tested = {rule for _, rules, _ in table.scenarios() for rule in rules}
    assert "clipping_active" in tested
    row = next(line for line in generated.splitlines() if line.startswith("| `clipping_active` |"))
    assert "`clip_every_step`" in row
    assert not any("heldback" in module for module, _ in table.SCENARIOS)


def test_a_rule_without_a_doc_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    class Undocumented(Base):
        name = "undocumented_rule"

    monkeypatch.setattr(table, "RULES", (*RULES, Undocumented))
    assert table.missing_docs() == ["undocumented_rule"]
    assert table.main(["--check"]) == 1
