"""``nbmonitor ctl`` against a real training script in another process: pause (the steps stop
advancing), resume, lr, checkpoint (the file loads), stop (the script exits with status 0, the
run closes "stopped", its steps contiguous); bad requests and runs that are not running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.helpers import wait_for

import nbmonitor
from nbmonitor.__main__ import main

SCRIPT = Path(__file__).with_name("steered_script.py")


def _ctl(*args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "nbmonitor", "ctl", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


def _progress(root: Path) -> tuple[int, float]:
    try:
        step, lr = (root / "progress").read_text().split()
    except (OSError, ValueError):
        return 0, float("nan")
    return int(step), float(lr)


def _events(run_dir: Path) -> list[dict[str, object]]:
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [e for e in map(json.loads, lines) if e.get("rule") == "steer"]


@pytest.fixture
def script(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert wait_for(lambda: _progress(tmp_path)[0] >= 3 or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        yield proc, tmp_path, Path((tmp_path / "run_dir").read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_ctl_pauses_resumes_checkpoints_sets_lr_and_stops_a_script(
    script: tuple[subprocess.Popen[str], Path, Path],
) -> None:
    proc, root, run_dir = script
    code, out, err = _ctl(str(run_dir), "pause")
    assert code == 0, err
    assert "sent pause" in out
    assert wait_for(lambda: any(e["evidence"]["action"] == "pause" for e in _events(run_dir)))
    paused_at = _progress(root)[0]
    time.sleep(1.0)
    assert _progress(root)[0] == paused_at  # paused: no step ends

    # Applied while paused, at the same boundary.
    assert _ctl(str(run_dir), "lr=0.005")[0] == 0
    assert _ctl(str(run_dir), "checkpoint")[0] == 0
    checkpoints = run_dir / "checkpoints"
    assert wait_for(lambda: checkpoints.is_dir() and any(checkpoints.glob("step-*.pt")))
    (path,) = checkpoints.glob("step-*.pt")
    ckpt = torch.load(path)
    assert ckpt["step"] == paused_at + 1  # the step the loop is paused at the end of
    assert set(ckpt) == {"model", "optimizer", "step"}
    assert ckpt["optimizer"]["param_groups"][0]["lr"] == 0.005
    assert _progress(root)[0] == paused_at

    assert _ctl(str(run_dir), "resume")[0] == 0
    assert wait_for(lambda: _progress(root)[0] > paused_at + 2)
    assert _progress(root)[1] == 0.005

    code, out, err = _ctl(str(run_dir), "stop")
    assert code == 0, err
    assert proc.wait(120) == 0  # a clean exit
    stdout, stderr = proc.communicate()
    assert "Traceback" not in stderr
    assert "training stopped at step" in stderr  # one line, the logger's
    assert "the loop ended by itself" not in stdout
    assert (root / "finally").read_text() == "ran"
    run = nbmonitor.open(run_dir)
    assert run.status == "stopped"
    steps = run.history()["step"].tolist()
    assert steps == list(range(1, len(steps) + 1))  # contiguous, none lost
    actions = [e["evidence"]["action"] for e in _events(run_dir)]
    assert actions == ["pause", "lr", "checkpoint", "resume", "stop"]
    assert all(e["evidence"]["source"] == "ctl" for e in _events(run_dir))

    # The run is over: ctl says so in one line, exit status 1.
    code, out, err = _ctl(str(run_dir), "pause")
    assert code == 1
    assert (
        err.strip()
        == f"nbmonitor ctl: the run {run_dir.name} is not running (stopped); nothing to steer"
    )


def test_ctl_refuses_bad_requests_in_one_line(
    script: tuple[subprocess.Popen[str], Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    proc, root, run_dir = script
    for bad, said in [
        ("lr=abc", "lr needs a finite number >= 0, got 'abc'"),
        ("lr=-1", "lr needs a finite number >= 0"),
        ("lr", "lr needs a finite number >= 0"),
        ("jump", "unknown request 'jump'"),
        ("pause=3", "pause takes no value"),
    ]:
        assert main(["ctl", str(run_dir), bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
    assert not any((run_dir / "control").iterdir())  # nothing was written
    # A file that is not the owner's own (here: writable by others) is refused, said as an event.
    bad = run_dir / "control" / "1-1.json"
    bad.write_text(json.dumps({"kind": "stop"}))
    bad.chmod(0o666)
    assert wait_for(lambda: not bad.exists())
    assert wait_for(lambda: len(_events(run_dir)) == 1)
    (event,) = _events(run_dir)
    assert event["severity"] == "warning"
    assert "writable by group or others" in str(event["message"])
    step = _progress(root)[0]
    assert wait_for(lambda: _progress(root)[0] > step + 2)  # not stopped
    assert proc.poll() is None


def test_ctl_on_a_folder_that_is_not_a_live_run(tmp_path: Path) -> None:
    code, _, err = _ctl(str(tmp_path / "nothing"), "pause")
    assert code != 0 and err.count("\n") == 1
    model = torch.nn.Linear(2, 1)
    with nbmonitor.attach(model, run_dir=tmp_path, display=False) as mon:
        pass
    code, _, err = _ctl(str(mon.run_dir), "stop")
    assert code == 1
    assert "is not running (closed)" in err


def test_the_reader_takes_only_the_owners_plain_small_files(tmp_path: Path) -> None:
    from nbmonitor.runs.control import (
        ControlReader,
        ControlRequest,
        Refused,
        make_control_dir,
        write_request,
    )

    folder = make_control_dir(tmp_path)
    assert folder.stat().st_mode & 0o777 == 0o700
    write_request(tmp_path, "lr", 0.1)
    os.mkfifo(folder / "2-fifo.json")  # would block a plain open()
    (folder / "3-link.json").symlink_to(folder.parent / "elsewhere.json")
    (folder / "4-big.json").write_text(json.dumps({"kind": "stop", "value": "x" * 5000}))
    (folder / "5-deep.json").write_text("[" * 50 + "]" * 50)
    (folder / "6-list.json").write_text("[1]")
    (folder / "7-text.json").write_bytes(b"\xff\xfe")
    for name in ("4-big.json", "5-deep.json", "6-list.json", "7-text.json"):
        (folder / name).chmod(0o600)
    (folder / ".8-tmp").write_text("half")  # a writer's temporary file: not read
    got = ControlReader(tmp_path).poll()
    requests = [g for g in got if isinstance(g, ControlRequest)]
    refused = {g.file: g.why for g in got if isinstance(g, Refused)}
    assert [(r.kind, r.value, r.source) for r in requests] == [("lr", 0.1, "ctl")]
    assert refused == {
        "2-fifo.json": "is not a regular file",
        "3-link.json": refused["3-link.json"],
        "4-big.json": "is over 4096 bytes",
        "5-deep.json": "is not a request (too deeply nested)",
        "6-list.json": "is not a request (not a JSON object)",
        "7-text.json": "is not JSON",
    }
    assert refused["3-link.json"].startswith("cannot be opened")
    assert sorted(p.name for p in folder.iterdir()) == [".8-tmp"]  # each read once, removed
    assert ControlReader(tmp_path).poll() == []

    # A file of another user is refused (its stat, as fstat gives it on the file opened).
    uid = os.getuid()
    reader = ControlReader(tmp_path)
    assert reader._bad_file(os.stat_result((0o100600, 0, 0, 1, uid + 1, 0, 10, 0, 0, 0))) == (
        f"is owned by uid {uid + 1}, not the run's ({uid})"
    )
    assert reader._bad_file(os.stat_result((0o100620, 0, 0, 1, uid, 0, 10, 0, 0, 0))) == (
        "is writable by group or others"
    )
    # A control folder of another user, or one others may write into, is not read at all.
    written = write_request(tmp_path, "stop")
    (foreign,) = ControlReader(tmp_path, uid=uid + 1).poll()
    assert isinstance(foreign, Refused)
    assert foreign.why == f"the control folder is owned by uid {uid}, not the run's ({uid + 1})"
    folder.chmod(0o777)
    try:
        (loose,) = ControlReader(tmp_path).poll()
        assert isinstance(loose, Refused) and "writable by group or others" in loose.why
        assert written.exists()  # left unread
    finally:
        folder.chmod(0o700)
