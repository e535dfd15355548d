"""Training-health rules: plain-language diagnoses of what is going wrong, and where.

Runs on the sampler thread, numpy only (no torch). See README.md in this folder.
"""

from __future__ import annotations

from nbmonitor.health.alert import Alert
from nbmonitor.health.checker import Health
from nbmonitor.health.diagnose import cause_alert, symptom_alert
from nbmonitor.health.doc import RuleDoc
from nbmonitor.health.explain import Explanation, explain
from nbmonitor.health.rule import Outcome, Rule, RuleFactory
from nbmonitor.health.rules import RULES
from nbmonitor.health.rules.gradients import non_finite_gradients
from nbmonitor.health.thresholds import Thresholds
from nbmonitor.health.view import HealthInput, HealthView
from nbmonitor.health.wording import MAX_NAMED, name_list

__all__ = [
    "MAX_NAMED",
    "RULES",
    "Alert",
    "Explanation",
    "Health",
    "HealthInput",
    "HealthView",
    "Outcome",
    "Rule",
    "RuleDoc",
    "RuleFactory",
    "Thresholds",
    "cause_alert",
    "explain",
    "name_list",
    "non_finite_gradients",
    "symptom_alert",
]
