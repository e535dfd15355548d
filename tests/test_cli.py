"""The command line: version, help a person can read, and a demo that runs as long as asked."""

from __future__ import annotations

import subprocess
import sys
import threading
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
    history = run.history()
    wall = history["time"]
    # Training filled the time asked for, not a step cap: the last step ended after the
    # deadline set at attach (a bound a slow machine cannot break: it only adds time).
    assert wall[-1] - run.meta["start_timestamp"] >= seconds, (run.meta["start_timestamp"], wall)
    # The step count and the lr schedule are known at attach, not guessed from a warm-up: the
    # run ends on its last step, its lr falls all the way, and is not 0 before the end.
    steps = history["step"]
    total = run.meta["attach"]["total_steps"]
    assert int(steps[-1]) == total == len(steps)
    lr = history["lr"]
    assert lr[0] > lr[len(lr) // 2] > lr[-2] > 0 and lr[-1] < 1e-3 * lr[0]


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


def test_tail_of_a_folder_that_appears_without_runs_says_so(tmp_path, capsys) -> None:
    later = tmp_path / "later"
    threading.Timer(0.05, later.mkdir).start()
    assert main(["tail", str(later), "--wait", "0.5", "--interval", "0.1"]) == 1
    assert "no run appeared in" in capsys.readouterr().err


def test_tail_of_a_file_or_a_folder_without_runs_says_so_at_once(tmp_path: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    (tmp_path / "empty").mkdir()
    cases = ((afile, "is a file, not a run folder"), (tmp_path / "empty", "holds no run"))
    for target, why in cases:
        start = time.monotonic()
        out = _cli("tail", str(target), check=False)  # the default --wait is 60 s
        assert time.monotonic() - start < 50, target  # said at once, not after the wait
        assert out.returncode == 2, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert why in line and "did not appear" not in line, line


def test_a_value_that_is_not_a_number_is_refused_without_internal_names() -> None:
    out = _cli("demo", "--seconds", "abc", check=False)
    assert out.returncode == 2
    assert "must be a positive number, not 'abc'" in out.stderr
    assert "_positive" not in out.stderr


def test_export_gives_the_real_reason_before_out(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    unknown = _cli("export", str(run), "--to", "xlsx", "--out", "x", check=False)
    assert unknown.returncode == 1
    assert "unknown export target 'xlsx'" in unknown.stdout and "TRACKIO" not in unknown.stdout
    live = _cli("export", str(run), "--to", "prometheus", "--out", "x", check=False)
    assert live.returncode == 1
    assert "Prometheus serves a live run" in live.stdout and "TRACKIO" not in live.stdout
    trackio = _cli("export", str(run), "--to", "trackio", "--out", "x", check=False)
    assert trackio.returncode == 2 and "TRACKIO_DIR" in trackio.stdout


def test_top_on_a_missing_runs_folder_is_an_error(tmp_path: Path) -> None:
    out = _cli("top", "--runs", str(tmp_path / "nothing"), "--once", "--no-devices", check=False)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert "does not exist" in line and "nothing" in line
