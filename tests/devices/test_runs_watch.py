"""RunsWatch: every run of a folder followed incrementally (nbmonitor top --runs)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbmonitor.runs.watch import RunsWatch

WRITER = Path(__file__).with_name("run_writer.py")


def write_run(root: Path, name: str, steps: int, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(WRITER), str(root), name, str(steps), *extra],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> Path:
    out = proc.communicate(timeout=120)[0] if not proc.stdout.closed else ""  # type: ignore[union-attr]
    assert proc.wait(120) == 0
    return Path(out.strip())


def test_rows_of_finished_and_running_runs(tmp_path: Path) -> None:
    finished = finish(write_run(tmp_path, "done", 40, "--total", "40"))
    (tmp_path / "hold").touch()
    running = write_run(tmp_path, "live", 30, "--total", "100", "--delay", "0.01", "--hold")
    path = Path(running.stdout.readline().strip())  # type: ignore[union-attr]
    running.stdout.close()  # type: ignore[union-attr]
    watch = RunsWatch(tmp_path, rescan_s=0.0)
    try:
        deadline = time.monotonic() + 60
        while True:
            rows = {r.name: r for r in watch.poll()}
            if path.name in rows and rows[path.name].step == 30:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert list(rows) == [path.name, finished.name]  # newest first
        live, done = rows[path.name], rows[finished.name]
        assert live.status == "running" and live.total_steps == 100
        assert math.isfinite(live.eta_s) and live.eta_s > 0
        assert live.samples_per_s == 6400.0
        assert live.alerts == 1 and live.last_alert == "loss spiked at 3"
        assert done.status == "closed" and done.step == 40 and math.isnan(done.eta_s)
        assert done.loss == pytest.approx(2.0 * math.exp(-40 / 50))
        detail = watch.detail(str(path))
        assert detail is not None
        assert list(detail.series["step"]) == [float(s) for s in range(1, 31)]
        assert set(detail.series) >= {"loss", "grad_norm", "step_time"}
        assert [a["rule"] for a in detail.alerts] == ["loss_spike"]
    finally:
        (tmp_path / "hold").unlink()
        finish(running)
    rows = {r.name: r for r in watch.poll()}
    assert rows[path.name].status == "closed"


def test_a_long_run_is_read_from_near_its_end_and_only_once(tmp_path: Path) -> None:
    path = finish(write_run(tmp_path, "long", 5000))
    size = (path / "steps.jsonl").stat().st_size
    watch = RunsWatch(tmp_path, tail_bytes=20_000, rescan_s=0.0)
    rows = watch.poll()
    assert rows[0].step == 5000
    detail = watch.detail(str(path))
    assert detail is not None and 0 < len(detail.series["step"]) < 200
    assert detail.series["step"][-1] == 5000.0
    offsets = watch.offsets()[str(path)]
    assert offsets["steps"] == size
    # A closed run read to its end is not read again.
    (path / "steps.jsonl").write_bytes(b"")  # would be an error if it were tailed again
    assert watch.poll()[0].step == 5000


def test_folders_that_are_not_runs_and_a_missing_root(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "meta.json").write_text("{not json")
    assert RunsWatch(tmp_path).poll() == []
    assert RunsWatch(tmp_path / "absent").poll() == []


def test_max_runs_follows_the_newest(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"2026010{i}-000000-r").mkdir()
        (tmp_path / f"2026010{i}-000000-r" / "meta.json").write_text("{}")
    rows = RunsWatch(tmp_path, max_runs=2).poll()
    assert [r.name for r in rows] == ["20260103-000000-r", "20260102-000000-r"]


def test_hostile_folders_neither_hang_nor_stop_the_others(tmp_path: Path) -> None:
    good = finish(write_run(tmp_path, "good", 5))
    fifo = tmp_path / "20990101-000000-fifo"
    fifo.mkdir()
    (fifo / "meta.json").write_text("{}")
    os.mkfifo(fifo / "steps.jsonl")  # open() would block: the reading contract refuses it
    evil = tmp_path / "20990101-000001-evil"
    evil.mkdir()
    (evil / "meta.json").write_text('{"files": {"steps": "../../etc/passwd"}}')
    (tmp_path / "20990101-000002-loop").mkdir()
    os.mkfifo(tmp_path / "20990101-000002-loop" / "meta.json")
    rows = {r.name: r for r in RunsWatch(tmp_path, tail_bytes=10).poll()}
    assert rows[good.name].step == 5
    assert rows[fifo.name].step == 0 and rows[fifo.name].last_alert  # says what is wrong
    assert "20990101-000002-loop" not in rows  # no readable meta.json: not a run


def test_a_bad_line_is_shown_in_its_row_without_touching_the_warnings_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a tail finds wrong is told to the watch (its row shows it), not caught as a
    warning: ``warnings.catch_warnings`` is process-wide, so catching there would swallow the
    warnings other threads raise meanwhile, and races them."""
    import warnings

    bad = tmp_path / "20990101-000000-bad"
    bad.mkdir()
    (bad / "meta.json").write_text('{"status": "closed"}')
    (bad / "steps.jsonl").write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": \xff}\n{"step": 2}\n')

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("RunsWatch changed the process-wide warnings state")

    monkeypatch.setattr(warnings, "catch_warnings", refused)
    (row,) = RunsWatch(tmp_path).poll()  # a RunDataWarning would fail the test (-W error)
    assert row.step == 2
    assert row.last_alert.endswith("steps.jsonl line 2: not UTF-8 (byte 10); skipped.")
