"""The reference pages are written from the code (``scripts/reference.py``): docs/api.md from
the docstrings and docs/cli.md from the command line's ``--help``. These fail when a page is out
of date, when a public name, a member, an attach option or a threshold has no doc, when a
command is missing, or when a docstring's example no longer runs."""

from __future__ import annotations

import dataclasses
import doctest
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import nbmonitor
from nbmonitor.health import Thresholds
from nbmonitor.options import AttachOptions, Options

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference", ROOT / "scripts" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference"] = module
    spec.loader.exec_module(module)
    return module


reference = _load()


def test_the_reference_pages_are_up_to_date() -> None:
    for path, page in reference.PAGES.items():
        assert path.read_text(encoding="utf-8") == page(), (
            f"{path.relative_to(ROOT)} is out of date: run python3 scripts/reference.py"
        )
    assert reference.main(["--check"]) == 0


def test_every_public_name_member_option_and_threshold_has_a_doc() -> None:
    assert reference.missing_docs() == [], "write these docstrings (scripts/reference.py)"


def test_every_public_name_attach_option_and_threshold_is_in_the_api_page() -> None:
    text = reference.API.read_text(encoding="utf-8")
    for name in nbmonitor.__all__:
        assert f"## `nbmonitor.{name}`" in text, name
    options = [f.name for f in dataclasses.fields(Options)]
    assert options == list(AttachOptions.__annotations__)
    for option in options:
        assert f"| `{option}` |" in text, option
    for field in dataclasses.fields(Thresholds):
        assert f"| `{field.name}` |" in text, field.name
    # Members of the classes a user holds: what a notebook calls.
    for member in ("mon.log", "mon.close", "mon.history", "run.history", "job.per_step"):
        assert f"### `{member}`" in text, member


def test_every_cli_command_is_in_the_cli_page() -> None:
    text = reference.CLI.read_text(encoding="utf-8")
    commands = reference.cli_commands()
    assert {"demo", "tail", "runs", "export", "top"} <= set(commands)
    for command in commands:
        assert f"## `nbmonitor {command}`" in text, command
        assert f"usage: nbmonitor {command}" in text, command


def test_an_undocumented_option_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = AttachOptions.__doc__ or ""
    start = doc.index("    interval:")
    end = doc.index("    total_steps:")
    monkeypatch.setattr(AttachOptions, "__doc__", doc[:start] + doc[end:])
    assert "attach option interval" in reference.missing_docs()
    assert reference.main(["--check"]) == 1


def test_a_stale_page_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference, "PAGES", {reference.API: lambda: "# something else\n"})
    assert reference.main(["--check"]) == 1


def test_the_docstrings_examples_run() -> None:
    tests = reference.examples()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    ran = 0
    for test in tests:
        result = runner.run(test)
        ran += result.attempted  # examples marked +SKIP are not attempted
    summary = runner.summarize(verbose=False)
    assert summary.failed == 0, f"{summary.failed} docstring example(s) failed (output above)"
    # Runnable examples exist (Thresholds, summary, open): the rest are marked +SKIP.
    assert ran >= 6, ran
