"""Tail: new records per poll from new bytes only, torn lines, close detection, late files."""

from __future__ import annotations

import json
import os
import pathlib
import socket

import pytest
from tests.runs.runs_helpers import make_log

from nbmonitor.runs import (
    STREAMS,
    RunDataWarning,
    RunNotFoundError,
    RunUnsafeError,
    Tail,
    open_run,
    tail,
)
from nbmonitor.runs.tail import wait_for_run
from nbmonitor.sinks import Batch


def test_poll_returns_new_records_per_stream(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    t = Tail(log.path)
    assert t.poll() == {}
    log.write(Batch({"steps": [{"step": 0.0, "loss": 1.0}], "system": [{"time": 1.0}]}))
    log.flush()
    assert t.poll() == {"steps": [{"step": 0.0, "loss": 1.0}], "system": [{"time": 1.0}]}
    assert t.poll() == {}
    log.write_steps([{"step": 1.0, "loss": 0.5}])
    log.write_events([{"time": 2.0, "rule": "nan", "layers": ["a"]}])
    log.flush()
    assert t.poll() == {
        "steps": [{"step": 1.0, "loss": 0.5}],
        "events": [{"time": 2.0, "rule": "nan", "layers": ["a"]}],
    }
    assert t.offsets["steps"] == (log.path / "steps.jsonl").stat().st_size
    log.close()


def test_poll_reads_only_the_new_bytes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log(tmp_path)
    log.write_steps([{"step": float(i), "loss": 1.0 / (i + 1)} for i in range(5000)])
    log.flush()
    t = Tail(log.path)
    assert len(t.poll()["steps"]) == 5000
    before = (log.path / "steps.jsonl").stat().st_size
    log.write_steps([{"step": float(i), "loss": 0.1} for i in range(5000, 5010)])
    log.flush()
    grown = (log.path / "steps.jsonl").stat().st_size - before

    reads: list[tuple[int, int]] = []
    real_read = tail.read_fd

    def spy(fd: int, start: int, limit: int | None, where: object) -> bytes:
        data = real_read(fd, start, limit, where)
        reads.append((start, len(data)))
        return data

    monkeypatch.setattr(tail, "read_fd", spy)
    new = t.poll()["steps"]
    assert [r["step"] for r in new] == [float(i) for i in range(5000, 5010)]
    assert reads == [(before, grown)]  # one read, from the old end, of exactly the new bytes
    log.close()


def test_torn_line_waits_for_its_newline(tmp_path: pathlib.Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    steps = run / "steps.jsonl"
    t = Tail(run)
    steps.write_bytes(b'{"step":0.0}\n{"step":1.0,"lo')
    assert t.poll() == {"steps": [{"step": 0.0}]}
    assert t.offsets["steps"] == len(b'{"step":0.0}\n')
    with open(steps, "ab") as f:
        f.write(b'ss":NaN}\n{"st')
    (got,) = t.poll()["steps"]
    assert got["step"] == 1.0 and got["loss"] != got["loss"]  # NaN, read exactly
    with open(steps, "ab") as f:
        f.write(b'ep":2.0}\n')
    assert t.poll() == {"steps": [{"step": 2.0}]}


def test_files_that_do_not_exist_yet(tmp_path: pathlib.Path) -> None:
    run = tmp_path / "later"
    t = Tail(run)  # nothing there yet: a run about to start
    assert t.poll() == {} and not t.closed
    run.mkdir()
    assert t.poll() == {}
    (run / "system.jsonl").write_bytes(b'{"time":1.0}\n')
    assert t.poll() == {"system": [{"time": 1.0}]}


def test_notices_the_run_closing_with_its_last_records(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    t = Tail(log.path)
    log.write_steps([{"step": 0.0}])
    log.flush()
    t.poll()
    assert not t.closed
    log.write_steps([{"step": 1.0}])
    log.close({"status": "closed", "steps": 2, "end_time": "2026-11-24T00:00:00+00:00"})
    assert t.poll() == {"steps": [{"step": 1.0}]}  # the poll that sees it closed has the rest
    assert t.closed and t.meta["steps"] == 2


def test_bad_complete_line_is_skipped_and_counted(tmp_path: pathlib.Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "steps.jsonl").write_bytes(b'{"step":0}\nnot json\n{"step":2}\n')
    t = Tail(run)
    with pytest.warns(RunDataWarning, match="line 2: not JSON"):
        assert t.poll() == {"steps": [{"step": 0}, {"step": 2}]}
    assert t.bad_lines == 1


def test_report_takes_the_problems_instead_of_warnings(tmp_path: pathlib.Path) -> None:
    """With ``report``, what is wrong is told to it, one line each, and nothing is warned (a
    RunDataWarning would fail this test: the suite runs with warnings as errors)."""
    run = tmp_path / "r"
    run.mkdir()
    (run / "steps.jsonl").write_bytes(b'{"step":0}\nnot json\n{"step":2}\n')
    told: list[str] = []
    t = Tail(run, report=told.append)
    assert t.poll() == {"steps": [{"step": 0}, {"step": 2}]}
    (run / "steps.jsonl").write_bytes(b'{"step":5}\n')  # shrank in place: rewritten
    assert t.poll() == {"steps": [{"step": 5}]}
    assert len(told) == 2 and t.bad_lines == 1
    assert told[0].endswith("steps.jsonl line 2: not JSON (Expecting value); skipped.")
    assert told[1].startswith("nbmonitor: ") and "shrank (11 bytes, 31 already read)" in told[1]
    assert all("\n" not in m and "nbmonitor: nbmonitor" not in m for m in told)


def test_rewritten_file_is_read_again_with_a_warning(tmp_path: pathlib.Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "steps.jsonl").write_bytes(b'{"step":0}\n{"step":1}\n')
    t = Tail(run)
    t.poll()
    (run / "steps.jsonl").write_bytes(b'{"step":5}\n')  # shrank in place: rewritten
    with pytest.warns(RunDataWarning, match="shrank") as got:
        assert t.poll() == {"steps": [{"step": 5}]}
    assert "\n" not in str(got[0].message)


def test_run_tail_starts_where_the_read_ended(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    log.write_steps([{"step": float(i)} for i in range(100)])
    log.flush()
    run = open_run(log.path)
    assert len(run.history()["step"]) == 100
    t = run.tail()
    log.write_steps([{"step": 100.0}])
    log.write_samples([{"time": 5.0}])
    log.flush()
    # steps continue after the read; system (never read) starts at its beginning
    assert t.poll() == {"steps": [{"step": 100.0}], "system": [{"time": 5.0}]}
    log.close()


def test_bad_arguments(tmp_path: pathlib.Path) -> None:
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(RunNotFoundError, match="not a folder"):
        Tail(afile)
    with pytest.raises(ValueError, match="unknown stream"):
        Tail(tmp_path, streams=["nope"])


def test_catching_up_a_long_file_is_bounded_per_poll(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tail, "MAX_POLL_BYTES", 100)
    run = tmp_path / "r"
    run.mkdir()
    (run / "steps.jsonl").write_bytes(b"".join(b'{"step":%d.0}\n' % i for i in range(50)))
    t = Tail(run)
    got: list[float] = []
    for _ in range(20):
        got += [r["step"] for r in t.poll().get("steps", [])]
    assert got == [float(i) for i in range(50)]  # several polls, nothing lost or repeated


def test_a_replaced_file_is_read_from_its_start_nothing_lost(tmp_path: pathlib.Path) -> None:
    """Rename + new file (log rotation, a restarted writer): the old file is drained, the new
    one read from its first byte."""
    run = tmp_path / "r"
    run.mkdir()
    steps = run / "steps.jsonl"
    steps.write_bytes(b'{"step":0}\n')
    t = Tail(run, streams=["steps"])
    assert t.poll() == {"steps": [{"step": 0}]}
    with open(steps, "ab") as f:
        f.write(b'{"step":1}\n')  # written to the old file after the last poll
    os.replace(steps, run / "steps.1.jsonl")
    steps.write_bytes(b'{"step":2}\n{"step":3}\n')
    assert t.poll() == {"steps": [{"step": 1}, {"step": 2}, {"step": 3}]}
    with open(steps, "ab") as f:
        f.write(b'{"step":4}\n')
    assert t.poll() == {"steps": [{"step": 4}]}
    t.close()


def test_a_long_line_is_skipped_with_a_warning_never_held(tmp_path: pathlib.Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    limit = STREAMS["steps"].max_line
    with open(run / "steps.jsonl", "wb") as f:
        f.write(b'{"step":0}\n{"step":1,"x":"')
        f.truncate(3 * limit)  # a line three times the bound, still without its newline
    t = Tail(run, streams=["steps"])
    with pytest.warns(RunDataWarning, match=f"line 2: longer than {limit} bytes"):
        got = [t.poll() for _ in range(4)]  # MAX_POLL_BYTES per poll: a few polls
    assert got[0] == {"steps": [{"step": 0}]} and not any(got[1:])
    assert len(t._cursors["steps"].split.rest) <= limit  # never held whole
    with open(run / "steps.jsonl", "ab") as f:
        f.write(b'"}\n{"step":2}\n')
    assert t.poll() == {"steps": [{"step": 2}]} and t.bad_lines == 1
    t.close()


def test_ended_when_the_writer_is_gone(tmp_path: pathlib.Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    meta = {"host": socket.gethostname(), "pid": 2**31 - 2, "start_timestamp": 1.0}
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "steps.jsonl").write_bytes(b'{"step":0}\n')
    t = Tail(run)
    assert t.poll() == {"steps": [{"step": 0}]}
    assert t.ended is None  # that poll found records: it may not be the last
    assert t.poll() == {}
    assert t.ended == f"its writer (pid {2**31 - 2}) is gone"
    # From another host only silence tells.
    (run / "meta.json").write_text(json.dumps({"host": "elsewhere.invalid", "pid": 5}))
    quiet = Tail(run, stale_s=0.0)
    quiet.poll()
    quiet.poll()
    assert quiet.ended is not None and quiet.ended.startswith("nothing was written for")
    t.close()
    quiet.close()


def test_a_typo_fails_at_once_a_later_run_is_waited_for(tmp_path: pathlib.Path) -> None:
    with pytest.raises(RunNotFoundError, match="neither it nor its parent folder"):
        Tail(tmp_path / "no" / "such")
    t = Tail(tmp_path / "later")
    said: list[str] = []
    with pytest.raises(RunNotFoundError, match="no run appeared"):
        wait_for_run(t, 0.2, say=said.append)
    assert said == [f"nbmonitor: waiting for {tmp_path / 'later'} to appear (up to 0.2 s)"]
    (tmp_path / "later").mkdir()
    os.mkfifo(tmp_path / "later" / "meta.json")
    with pytest.raises(RunUnsafeError, match="FIFO"):  # appears, but not as a file: at once
        wait_for_run(t, 5.0)
