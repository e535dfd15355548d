"""A rule's documentation, as data: what ``docs/diagnosis.md``'s table of causes is written
from (``python -m benchmarks.diagnosis.table``), so the table cannot drift from the code.

Every rule in ``rules.RULES`` carries one as its ``doc``
(``tests/diagnosis/test_docs_table.py`` fails for a rule without it, and when the table in the
docs is out of date). The symptoms a cause
explains are not repeated here: they are the rule's ``explains`` (what ``Health`` folds).
"""

from __future__ import annotations

from dataclasses import dataclass

# What a rule names. A cause is what the user did (the alert says so, with its evidence and one
# fix); a symptom is what is seen when no cause is supported (the last resort); a finding is
# about the machine, the data pipeline or nbmonitor's readings rather than the model.
CAUSE = "cause"
SYMPTOM = "symptom"
FINDING = "finding"
KINDS = (CAUSE, SYMPTOM, FINDING)


@dataclass(frozen=True)
class RuleDoc:
    """One rule's entry in the table of causes. Each text is one plain sentence or phrase,
    written for the user (Markdown code spans allowed), without a final full stop."""

    kind: str  # CAUSE, SYMPTOM or FINDING
    names: str  # the cause in the user's terms, or the symptom as seen
    evidence: str  # what it reads and how it judges ("grad norm growing linearly with the step")
    fix: str  # the one fix it proposes
    silent_on: tuple[str, ...] = ()  # healthy patterns it is known to stay silent on

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"RuleDoc.kind must be one of {', '.join(KINDS)}, got {self.kind!r}.")
        for field in ("names", "evidence", "fix"):
            if not getattr(self, field).strip():
                raise ValueError(f"RuleDoc.{field} is empty.")


__all__ = ["CAUSE", "FINDING", "KINDS", "SYMPTOM", "RuleDoc"]
