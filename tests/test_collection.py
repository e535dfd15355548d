"""The suite collects every folder of tests: a folder whose name pytest skips by default (``dist``,
``build``, ``venv``...) would drop its tests from every run without a word (tests/dist did)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def test_no_folder_of_tests_is_skipped_by_name(pytestconfig: pytest.Config) -> None:
    skipped = pytestconfig.getini("norecursedirs")
    folders = {path.parent for path in TESTS.rglob("test_*.py")}
    assert TESTS / "dist" in folders
    left_out = [
        str(folder.relative_to(TESTS))
        for folder in sorted(folders)
        for part in folder.relative_to(TESTS).parts
        if any(fnmatch.fnmatch(part, pattern) for pattern in skipped)
    ]
    assert left_out == []
