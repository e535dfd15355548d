"""The README's test command does its own set-up: scripts/test installs the programs the suite
drives (or stops saying what is missing), and under it a missing program fails, never skips."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pytest(
    args: list[str], env: dict[str, str], cwd: pathlib.Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NBMONITOR_REQUIRE_TOOLS")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def test_a_missing_prometheus_skips_by_hand_and_fails_under_scripts_test(
    tmp_path: pathlib.Path,
) -> None:
    # A PATH holding only this Python: neither prometheus nor promtool can be found.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    target = (
        "tests/export/test_prometheus.py::test_promtool_finds_the_exposition_clean_with_dcgm_labels"
    )
    by_hand = _pytest(["-rs", target], _env(PATH=str(bin_dir)), ROOT)
    assert by_hand.returncode == 0, by_hand.stdout[-2000:]
    assert "1 skipped" in by_hand.stdout
    documented = _pytest([target], _env(PATH=str(bin_dir), NBMONITOR_REQUIRE_TOOLS="1"), ROOT)
    assert documented.returncode == 1, documented.stdout[-2000:]
    assert "1 failed" in documented.stdout
    assert "prometheus is not installed" in documented.stdout


def test_a_missing_browser_fails_under_scripts_test(tmp_path: pathlib.Path) -> None:
    target = "tests/ui/test_panel_screenshots.py"
    env = _env(NBMONITOR_CHROMIUM=str(tmp_path / "no-chromium"), NBMONITOR_REQUIRE_TOOLS="1")
    documented = _pytest(["-x", target], env, ROOT)
    assert documented.returncode == 1, documented.stdout[-2000:]
    assert "browser test cannot run" in documented.stdout


def test_scripts_test_says_what_is_missing_when_it_cannot_install(tmp_path: pathlib.Path) -> None:
    # Not root (a stand-in `id` says uid 1000) and no chromium where it looks: one line, exit 1,
    # before any test runs.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_id = bin_dir / "id"
    fake_id.write_text("#!/bin/sh\necho 1000\n")
    fake_id.chmod(0o755)
    env = _env(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        NBMONITOR_CHROMIUM=str(tmp_path / "no-chromium"),
    )
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test"), "--collect-only"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "scripts/test: missing chromium; install it first: sudo apt-get install -y chromium"
    ], done.stderr
    assert done.stdout == ""
