"""Every file nbmonitor writes whole (not an append-only stream) is written atomically: a
reader sees the old file or the new one, never half; a process killed halfway, or a writer
failing halfway, leaves the old file as it was (nbmonitor/_atomic.py and its users: the
profiler's trace and table, the terminal app's snapshot, the files exporter, meta.json and
the sidecar through runs/format.py)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from nbmonitor._atomic import atomic_path, write_atomic

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Writes half of the new content through atomic_path, then dies by SIGKILL mid-write.
KILLED_HALFWAY = """
import os, signal, sys
from nbmonitor._atomic import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    with open(tmp, "wb") as f:
        f.write(b"N" * 500_000)
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
"""


def leftovers(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_process_killed_mid_write_leaves_the_old_file_whole(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "meta.json"
    target.write_bytes(b"O" * 1000)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_HALFWAY, str(target)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL
    assert target.read_bytes() == b"O" * 1000  # the old file, whole
    # What the killed process had written is a hidden temporary name, never the file's.
    (tmp,) = leftovers(tmp_path)
    assert tmp.startswith(".meta.json.") and (tmp_path / tmp).stat().st_size == 500_000


def test_a_failure_halfway_keeps_the_old_file_and_cleans_up(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "table.csv"
    target.write_bytes(b"old\n")
    with pytest.raises(OSError, match="disk full"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise OSError("disk full")
    assert target.read_bytes() == b"old\n" and leftovers(tmp_path) == []
    write_atomic(target, b"new\n")
    assert target.read_bytes() == b"new\n" and leftovers(tmp_path) == []


def test_a_reader_never_sees_half_a_file(tmp_path: pathlib.Path) -> None:
    """A reader polling the file while it is rewritten 200 times sees only whole versions."""
    target = tmp_path / "snapshot.txt"
    versions = [bytes([65 + i % 26]) * 200_000 for i in range(200)]
    write_atomic(target, versions[0])
    whole = set(versions)
    seen: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(target.read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for data in versions:
            write_atomic(target, data)
    finally:
        done.set()
        reader.join(60)
    assert seen and all(s in whole for s in seen)
    assert leftovers(tmp_path) == []


def test_the_profilers_files_are_whole_or_absent(tmp_path: pathlib.Path) -> None:
    """A trace export that fails halfway (torch writing hundreds of MB, the disk full) leaves
    no half trace where a viewer would open it; the error is kept, not raised."""
    pytest.importorskip("torch")
    from nbmonitor._capture.profiler import ProfileRun
    from nbmonitor.errors import ErrorLog

    class Events(list[Any]):
        def table(self, **kwargs: Any) -> str:
            return "the table"

    class Prof:
        def key_averages(self) -> Events:
            return Events()

        def export_chrome_trace(self, path: str) -> None:
            pathlib.Path(path).write_bytes(b'{"traceEvents": [')  # half a trace
            raise OSError("No space left on device")

    out = tmp_path / "profiles"
    errors = ErrorLog()
    run = ProfileRun(steps=1, wait=0, warmup=0, cuda=False, out_dir=out, errors=errors,
                     on_done=lambda r: None, detach=lambda r: None)  # fmt: skip
    # The profile thread's body, with a torch that fails to write its trace halfway.
    run._process(Prof(), 3)
    assert run.result is not None and "No space left on device" in str(run.result.error)
    assert sorted(p.name for p in out.iterdir()) == []  # no half trace, no leftover

    class Good(Prof):
        def export_chrome_trace(self, path: str) -> None:
            pathlib.Path(path).write_bytes(b'{"traceEvents": []}')

    run._process(Good(), 3)
    assert sorted(p.name for p in out.iterdir()) == ["steps-0-3.pt.trace.json", "steps-0-3.txt"]
    assert (out / "steps-0-3.txt").read_text() == "the table"


def test_an_export_that_fails_halfway_keeps_the_earlier_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pd = pytest.importorskip("pandas")
    import nbmonitor
    from nbmonitor.sinks import RunLogSink

    log = RunLogSink.create(tmp_path / "runs", "r", {})
    log.write_steps([{"step": float(s), "loss": 1.0 / s} for s in range(1, 50)])
    log.close({"status": "closed"})
    run = nbmonitor.open(log.path)
    out = tmp_path / "csv"
    (steps,) = [p for p in run.to_csv(out) if p.name == "history.csv"]
    before = steps.read_bytes()
    to_csv = pd.DataFrame.to_csv

    def half(self: Any, path: Any, **kwargs: Any) -> None:
        to_csv(self.head(3), path, **kwargs)  # a few rows written, then the disk is full
        raise OSError("No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", half)
    with pytest.raises(OSError, match="No space"):
        run.to_csv(out)
    assert steps.read_bytes() == before and leftovers(out) == []


def test_the_terminal_apps_snapshot_is_written_whole(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot's files go through write_atomic (a rename into place), never a write into
    the file a user may be opening."""
    pytest.importorskip("textual")
    from nbmonitor.ui.tui import app

    written: list[pathlib.Path] = []

    def spy(path: pathlib.Path, data: bytes) -> None:
        written.append(pathlib.Path(path))
        write_atomic(path, data)

    monkeypatch.setattr(app, "write_atomic", spy)
    top = app.TopApp.__new__(app.TopApp)
    top.save_dir, top.clock, top.saved = tmp_path, lambda: 0.0, []
    monkeypatch.setattr(app.TopApp, "snapshot_text", lambda self: "text\n")
    monkeypatch.setattr(app.TopApp, "snapshot_csv", lambda self: "a,b\n")
    monkeypatch.setattr(app.TopApp, "notify", lambda self, *a, **k: None)
    top.action_save()
    assert [p.suffix for p in written] == [".txt", ".csv"] and top.saved == written
    assert written[0].read_text() == "text\n" and leftovers(tmp_path) == []
