"""The real ``nbmonitor`` command on hostile and missing runs: the exit status, one line saying
what is wrong, and never an escape byte from a file on the terminal."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
from tests.hostile.corpus import ESC, lines, meta, plain

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Any byte of a control sequence a file could smuggle: C0 but newline, DEL, and C1 (UTF-8).
_CONTROL = {*range(0x00, 0x0A), *range(0x0B, 0x20), 0x7F}


def _command() -> list[str]:
    found = shutil.which("nbmonitor")
    return [found] if found else [sys.executable, "-m", "nbmonitor"]


def nbmonitor(
    *args: str, cwd: pathlib.Path, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(
        [*_command(), *args], capture_output=True, timeout=timeout, env=env, cwd=cwd
    )


def clean(out: bytes) -> None:
    assert not (_CONTROL & set(out)), out[:400]
    text = out.decode("utf-8")
    assert not any(0x80 <= ord(c) < 0xA0 or c in "\u202e\u200f" for c in text), text[:400]


def one_line(err: bytes) -> str:
    text = err.decode().strip()
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def test_runs_without_a_runs_folder_says_so(tmp_path: pathlib.Path) -> None:
    proc = nbmonitor("runs", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == b""
    assert "cannot list runs in 'runs' (not found)" in one_line(proc.stderr)


def test_runs_lists_hostile_runs_without_their_escapes(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "runs"
    bad = root / f"run{ESC}"
    meta(bad, name=ESC, start_time=ESC, backend={"name": ESC})
    (bad / "steps.jsonl").write_bytes(lines([{"step": 0.0, "loss": 1.0}]))
    fifo = root / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "meta.json")
    plain(root, "good")
    (root / "deep").mkdir()
    (root / "deep" / "meta.json").write_bytes(b"[" * 100_000)
    proc = nbmonitor("runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    clean(proc.stdout)
    clean(proc.stderr)
    out = proc.stdout.decode()
    assert "good" in out and "closed" in out and "run?]0;pwned?" in out
    assert out.count("unreadable (") == 2  # the FIFO and the deep meta.json, each its row


def test_tail_of_a_typo_fails_at_once(tmp_path: pathlib.Path) -> None:
    start = time.monotonic()
    proc = nbmonitor("tail", str(tmp_path / "no" / "such" / "run"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "does not exist either" in one_line(proc.stderr)
    assert time.monotonic() - start < 30  # no waiting (the bound is the interpreter's start)


def test_tail_waits_for_a_run_then_gives_up(tmp_path: pathlib.Path) -> None:
    proc = nbmonitor("tail", str(tmp_path / "later"), "--wait", "1", "--interval", "0.2",
                     cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1
    assert f"waiting for {tmp_path / 'later'} to appear" in proc.stdout.decode()
    assert "did not appear within 1 s" in one_line(proc.stderr)


def test_tail_follows_a_run_that_appears_later(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "later"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*_command(), "tail", str(target), "--wait", "60", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        # Made only once the command says it waits for it: it waited, at any speed.
        assert "waiting for" in proc.stdout.readline().decode()  # type: ignore[union-attr]
        plain(tmp_path, "later", n=5)  # closed, 5 steps
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.decode().strip().splitlines()[-1] == "nbmonitor tail: later: 4 steps, the run closed"


@pytest.mark.parametrize("case", ["fifo meta", "deep meta", "meta is a folder", "dev zero"])
def test_tail_of_a_hostile_run_is_one_line(tmp_path: pathlib.Path, case: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if case == "fifo meta":
        os.mkfifo(run / "meta.json")
    elif case == "deep meta":
        (run / "meta.json").write_bytes(b'{"a":' * 100_000)
    elif case == "meta is a folder":
        (run / "meta.json").mkdir()
    else:
        os.symlink("/dev/zero", run / "meta.json")
    proc = nbmonitor("tail", str(run), "--wait", "1", cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert one_line(proc.stderr).startswith("nbmonitor tail: ")
    clean(proc.stdout)


def test_tail_ends_when_the_writer_is_gone(tmp_path: pathlib.Path) -> None:
    """A run whose writer was killed (its pid is gone on this host) ends the follow with a
    line saying so, and the escapes in its alert never reach the terminal."""
    import socket

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    run = tmp_path / "run"
    meta(run, status=None, steps=None, host=socket.gethostname(), pid=int(dead.stdout),
         start_timestamp=time.time() - 5, name=ESC)  # fmt: skip
    (run / "steps.jsonl").write_bytes(lines([{"step": 1.0, "loss": 2.0}, {"step": 2.0}]))
    alert = {"time": time.time(), "rule": "loss_spike", "severity": "warning", "step": 2,
             "message": f"loss spiked {ESC}", "subject": "loss"}  # fmt: skip
    (run / "events.jsonl").write_bytes(lines([alert]) + b"\xff\xfe not json\n" + lines([alert]))
    proc = nbmonitor("tail", str(run), "--interval", "0.2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    clean(proc.stdout)
    clean(proc.stderr)
    last = proc.stdout.decode().strip().splitlines()[-1]
    summary = [ln for ln in proc.stderr.decode().splitlines() if " steps in " in ln]
    assert len(summary) == 1 and " killed: 2 steps in " in summary[0]  # not "closed"
    assert last == (
        "nbmonitor tail: run: 2 steps; stopped following: the writer is gone and the run was "
        "never closed (killed)"
    )
    warning = [ln for ln in proc.stderr.decode().splitlines() if "line 2" in ln]
    assert warning and "events.jsonl line 2: not UTF-8" in warning[0]


def test_runs_of_many_runs_lists_them_all(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "runs"
    for i in range(300):
        path = root / f"r{i:03d}"
        path.mkdir(parents=True)
        (path / "meta.json").write_text(json.dumps({"status": "closed", "steps": i}))
    proc = nbmonitor("runs", str(root), cwd=tmp_path)
    assert proc.returncode == 0
    assert len(proc.stdout.decode().strip().splitlines()) == 301  # the header and 300 rows


def test_export_of_a_job_leaves_out_an_unreadable_rank(tmp_path: pathlib.Path) -> None:
    """One rank whose meta.json is damaged never costs the job's other ranks: they are
    exported, and a warning names the rank left out."""
    job = tmp_path / "job"
    meta(job, layout="ranks", world_size=2)
    plain(job, "rank0")
    (job / "rank1").mkdir()
    (job / "rank1" / "meta.json").write_bytes(b"[" * 10_000)
    proc = nbmonitor("export", str(job), "--to", "csv", "--out", str(tmp_path / "csv"),
                     cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "csv" / "history.csv").read_text().count("\n") == 4  # header, 3 steps
    warned = [ln for ln in proc.stderr.decode().splitlines() if "rank1" in ln]
    assert len(warned) == 1 and "Rank folder rank1 is left out." in warned[0]
    (job / "rank0" / "meta.json").write_bytes(b"[" * 10_000)  # no rank left: one line, exit 1
    proc = nbmonitor("export", str(job), "--to", "csv", "--out", str(tmp_path / "csv2"),
                     cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    last = proc.stdout.decode().strip().splitlines()[-1]
    assert last.startswith("nbmonitor: no rank of the job at ") and last.endswith("could be read.")
