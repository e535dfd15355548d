"""The command line: version, help a person can read, and a demo that runs as long as asked."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import nbmonitor
from nbmonitor.__main__ import COMMANDS, build_parser, main


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nbmonitor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
    )


def test_version() -> None:
    out = _cli("--version")
    assert out.stdout.strip() == f"nbmonitor {nbmonitor.__version__}"


def test_help_is_plain_text_and_every_option_is_explained() -> None:
    parser = build_parser()
    top = parser.format_help()
    assert "``" not in top
    assert "demo" in top and "--version" in top
    subparsers = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert len(subparsers) == len(COMMANDS)
    for name, sub in subparsers.items():
        text = sub.format_help()
        assert "``" not in text, name
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help"


def test_no_command_is_an_error() -> None:
    out = _cli(check=False)
    assert out.returncode == 2
    assert "COMMAND" in out.stderr


def test_demo_rejects_a_non_positive_duration() -> None:
    out = _cli("demo", "--seconds", "0", check=False)
    assert out.returncode == 2
    assert "positive" in out.stderr


@pytest.mark.slow
def test_demo_runs_for_the_requested_seconds(tmp_path: Path) -> None:
    seconds = 4.0
    start = time.monotonic()
    out = _cli("demo", "--seconds", str(seconds), "--run-dir", str(tmp_path), "--interval", "0.2")
    elapsed = time.monotonic() - start
    assert "run written to" in out.stdout
    assert elapsed >= seconds
    (run_dir,) = tmp_path.iterdir()
    run = nbmonitor.open(run_dir)
    wall = run.history()["time"]
    # Training filled the time asked for, not a step cap: the last step ended after the
    # deadline set at attach (a bound a slow machine cannot break: it only adds time).
    assert wall[-1] - run.meta["start_timestamp"] >= seconds, (run.meta["start_timestamp"], wall)


def test_tail_and_runs_on_a_finished_run(tmp_path, capsys) -> None:
    import torch
    from tests.helpers import mlp, train

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, name="cli", display=False) as mon:
        train(model, opt, mon, 7)
    assert main(["tail", str(tmp_path), "--interval", "0.1"]) == 0  # the newest run
    assert capsys.readouterr().out.strip().endswith(f"{mon.run_dir.name}: 7 steps, the run closed")
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert mon.run_dir.name in out and "closed" in out


def test_tail_of_a_folder_without_runs_says_so(tmp_path, capsys) -> None:
    assert main(["tail", str(tmp_path), "--wait", "0.2"]) == 1
    assert "no run appeared in" in capsys.readouterr().err
