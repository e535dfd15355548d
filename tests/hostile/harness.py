"""Run hostile cases (``corpus.CASES``) in this process, under a memory cap, and report.

``python tests/hostile/harness.py TMPDIR CASE...`` builds each case under TMPDIR and runs every
reading operation on it: ``open``, ``history``/``system``/``layers``/``events``/spans,
``status``, ``Tail.poll``, ``count_rows``, ``export_trace``, the replay entrance and its run
model, ``list_runs`` and its text, ``compare_series``. Each outcome must be a value, a one-line
``RunDirError`` (subclass) or one-line ``RunDataWarning``s; anything else (TypeError,
RecursionError, OSError, MemoryError, a multi-line message) is a problem. Prints one JSON line
per case, ``{"case": ..., "problems": [...]}``, as soon as the case is done, so that the test
can tell which case hung. The caller sets the timeout; the memory cap is set here.
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

MEMORY_CAP = 3 << 30  # address space: far above what a bounded reader needs
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _outcome(problems: list[str], what: str, fn: Callable[[], Any]) -> Any:
    """Call ``fn``; note a problem unless it returned or raised a one-line RunDirError, and
    unless every warning it raised is a one-line RunDataWarning."""
    from nbmonitor.runs.format import RunDataWarning, RunDirError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn()
        except RunDirError as exc:
            if "\n" in str(exc):
                problems.append(f"{what}: RunDirError message spans lines: {str(exc)[:200]!r}")
            result = exc
        except BaseException as exc:  # everything else is what the contract rules out
            tb = traceback.format_exc(limit=-3).replace("\n", " | ")[-600:]
            problems.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]} [{tb}]")
            result = exc
    for w in caught:
        if not issubclass(w.category, RunDataWarning):
            problems.append(f"{what}: warning {w.category.__name__}: {str(w.message)[:200]}")
        elif "\n" in str(w.message):
            problems.append(f"{what}: warning spans lines")
    _outcome.warnings = [str(w.message) for w in caught]  # type: ignore[attr-defined]
    return result


def _read_run(path: pathlib.Path, problems: list[str], out: pathlib.Path) -> dict[str, Any]:
    import nbmonitor.replay as replay
    from nbmonitor.runs import Tail, open_run
    from nbmonitor.runs.catalog import count_rows
    from nbmonitor.runs.format import RunDirError
    from nbmonitor.runs.trace import write_trace

    got: dict[str, Any] = {"warnings": []}
    where = path.name
    run = _outcome(problems, f"{where}: open", lambda: open_run(path))
    got["open"] = run
    got["warnings"] += _outcome.warnings  # type: ignore[attr-defined]
    if isinstance(run, BaseException):
        _outcome(problems, f"{where}: Tail", lambda: Tail(path).poll())
        _outcome(problems, f"{where}: replay.open", lambda: replay.open(path))
        return got
    for name in ("history", "system", "layers", "events"):
        got[name] = _outcome(problems, f"{where}: {name}", getattr(run, name))
        got["warnings"] += _outcome.warnings  # type: ignore[attr-defined]
    got["spans"] = _outcome(problems, f"{where}: spans", lambda: run.records("spans"))
    _outcome(problems, f"{where}: status", lambda: run.status)
    _outcome(problems, f"{where}: count_rows", lambda: count_rows(run))

    def tail() -> None:
        t = run.tail()
        t.poll()
        t.poll()
        _ = t.ended
        t.close()
        t2 = Tail(path)
        t2.poll()
        t2.close()

    _outcome(problems, f"{where}: tail", tail)
    _outcome(problems, f"{where}: export_trace", lambda: write_trace(path, out / "trace.json"))

    def entrance() -> None:
        opened = replay.open(path)
        opened.state()
        opened.frame()

    _outcome(problems, f"{where}: replay", entrance)
    del RunDirError
    return got


def run_case(name: str, tmp: pathlib.Path) -> list[str]:
    from tests.hostile import corpus

    from nbmonitor.replay import compare_series
    from nbmonitor.runs import list_runs

    root = tmp / name / "runs"
    root.parent.mkdir(parents=True)
    expect = corpus.CASES[name](root)
    if name == "permissions":
        corpus.install_denials()
    problems: list[str] = []
    entries = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    results: dict[str, dict[str, Any]] = {}
    if len(entries) <= 50:
        for path in entries:
            results[path.name] = _read_run(path, problems, tmp / name)
    table = _outcome(problems, "list_runs", lambda: list_runs(root))
    if not isinstance(table, BaseException):
        _outcome(problems, "list_runs text", lambda: (str(table), table._repr_html_()))
        unreadable = sum(str(r["status"]).startswith("unreadable") for r in table.rows)
        if expect.listed is not None and len(table) != expect.listed:
            problems.append(f"list_runs gave {len(table)} rows, expected {expect.listed}")
        if expect.unreadable is not None and unreadable != expect.unreadable:
            problems.append(f"{unreadable} rows unreadable, expected {expect.unreadable}")
    if len(entries) <= 50:
        _outcome(problems, "compare_series", lambda: compare_series(root))
    first = results.get("run") or (next(iter(results.values())) if results else None)
    if first is not None:
        _check(expect, first, problems)
    for extra in expect.extra:
        problems += extra(root)
    return problems


def _check(expect: Any, got: dict[str, Any], problems: list[str]) -> None:
    opened = got["open"]
    if expect.open_error is not None:
        if type(opened).__name__ != expect.open_error:
            problems.append(f"open gave {opened!r}, expected {expect.open_error}")
        return
    if isinstance(opened, BaseException):
        problems.append(f"open raised {opened!r}")
        return
    if expect.steps is not None:
        history = got.get("history")
        steps = [] if isinstance(history, BaseException) else list(history.get("step", []))
        if steps != expect.steps:
            problems.append(f"history steps {steps[:20]}, expected {expect.steps}")
    if expect.warn is not None and not any(expect.warn in w for w in got["warnings"]):
        problems.append(f"no warning saying {expect.warn!r}: {got['warnings'][:5]}")
    for what in ("events", "spans"):
        want = getattr(expect, what)
        value = got.get(what)
        if want is not None and (not isinstance(value, list) or len(value) != want):
            problems.append(f"{what}: {value!r:.300}, expected {want} records")


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    sys.setrecursionlimit(1000)
    sys.path.insert(0, str(ROOT))
    tmp = pathlib.Path(sys.argv[1])
    for name in sys.argv[2:]:
        try:
            problems = run_case(name, tmp)
        except BaseException as exc:  # a builder or the harness itself: still one report
            problems = [f"harness: {type(exc).__name__}: {exc}"]
        print(json.dumps({"case": name, "problems": problems}), flush=True)
    os._exit(0)  # writer threads and sockets of the corpus end with the process


if __name__ == "__main__":
    main()
