"""Programs outside Python that some tests drive (Debian's chromium, prometheus, promtool).

Run by hand, a test whose program is missing skips, saying what to install. Run as the README
documents (`bash scripts/test`, which installs them and sets NBMONITOR_REQUIRE_TOOLS) or in CI,
it fails instead: a missing browser or server never passes the suite having tested less.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required() -> bool:
    """Whether a missing program fails the test rather than skipping it."""
    return bool(os.environ.get("NBMONITOR_REQUIRE_TOOLS") or os.environ.get("CI"))


def missing_tool(what: str) -> NoReturn:
    """Skip (by hand) or fail (scripts/test, CI) a test that cannot run: ``what`` is missing."""
    if required():
        pytest.fail(f"{what}; scripts/test installs it (apt-get), or install it by hand")
    pytest.skip(what)
