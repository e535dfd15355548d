"""Every alert Health raises in these tests names its subject as data (see health/alert.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nbmonitor.health import Alert, Health, HealthInput
from nbmonitor.health.alert import LAYERS, is_subject


def check_subject(alert: Alert) -> None:
    assert is_subject(alert.subject), alert
    if alert.subject == LAYERS:
        assert alert.layers, alert


@pytest.fixture(autouse=True)
def alerts_have_subjects(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    check = Health.check

    def checked(self: Health, inp: HealthInput, **options: Any) -> list[Alert]:
        alerts = check(self, inp, **options)
        for alert in alerts:
            check_subject(alert)
        return alerts

    monkeypatch.setattr(Health, "check", checked)
    yield
