"""The run log's writer process (nbmonitor/sinks/writer.py): the same bytes as the run log
written in process, nothing lost or doubled when the child dies at any point or stops
answering, a bounded close that never raises, and a killed parent whose rows the child
still writes."""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from nbmonitor.replay import open as open_run
from nbmonitor.runs.column_rows import ColumnRows, RowParts
from nbmonitor.sinks import runlog
from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.runlog import RunLogSink
from nbmonitor.sinks.writer import WriterProcess

REPO = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")


class Version(str):
    """Like ``torch.torch_version.TorchVersion``: a str subclass the writer must not import."""


class Shape(tuple[int, ...]):
    """Like ``torch.Size``."""


def _batches(n: int, rows: int = 120, seed: int = 0) -> list[Batch]:
    """Ticks with every kind of row a run writes: steps of floats (NaN, infinities, -0.0,
    17 digits), a key set that changes, wide layer rows, events with strings and ints."""
    rng = random.Random(seed)
    out, step = [], 0
    for tick in range(n):
        steps = []
        for _ in range(rows):
            step += 1
            row: dict[str, object] = {
                "step": float(step),
                "loss": rng.random() * 10 ** rng.randint(-9, 9),
            }
            row["grad_norm"] = rng.choice([math.nan, math.inf, -math.inf, -0.0, rng.random()])
            if step % 7 == 0:
                row["lr"] = 1e-3 / step
            steps.append(row)
        layers = [
            {"step": float(step), **{f"grad_norm/l{i}.weight": rng.random() for i in range(40)}}
        ]
        events = [
            {"kind": "alert", "step": step, "message": f'tick {tick} – é "q"'},
            {"kind": "x", "version": Version("2.1"), "shape": Shape((2, 3)), "v": np.float64(0.1)},
        ]
        out.append(Batch({"steps": steps, "layers": layers, "events": events}))
    return out


def _reference(root: pathlib.Path, batches: list[Batch]) -> pathlib.Path:
    log = RunLogSink.create(root, "reference", {})
    for b in batches:
        log.write(b)
        log.flush()
    log.close({"status": "finished"})
    return log.path


def _same_run(a: pathlib.Path, b: pathlib.Path) -> None:
    for name in ("steps.jsonl", "layers.jsonl", "events.jsonl", "system.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ha, hb = open_run(a).history(), open_run(b).history()
    assert list(ha) == list(hb)
    for key in hb:
        np.testing.assert_array_equal(np.asarray(ha[key]), np.asarray(hb[key]), err_msg=key)


@pytest.fixture
def offloaded(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunLogSink]:
    monkeypatch.setattr(runlog, "OFFLOAD_VALUES", 1)  # the first write starts the child
    monkeypatch.setattr(runlog, "OFFLOAD_AFTER_VALUES", 0)
    meta = {"versions": {"torch": Version("2.1")}}  # the child never imports this module
    log = RunLogSink.create(tmp_path, "offloaded", meta, offload=True)
    yield log
    log.close()


def _until_handed_over(log: RunLogSink, batches: list[Batch]) -> int:
    """Write and flush ``batches`` until the child has taken over (written here till then);
    how many were written."""
    deadline = time.monotonic() + 60
    for i, b in enumerate(batches):
        log.write(b)
        log.flush()
        if log._writer is not None:
            return i + 1
        assert time.monotonic() < deadline, "the writer process never became ready"
        time.sleep(0.2)
    raise AssertionError("the writer process did not take over")


def test_the_child_writes_the_same_bytes_and_sidecar(
    tmp_path: pathlib.Path, offloaded: RunLogSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("nbmonitor.runs.sidecar.CHUNK_VALUES", 2000)  # chunks cut by the child
    batches = _batches(60)
    k = _until_handed_over(offloaded, batches)
    batches = batches[: k + 12]
    for b in batches[k:]:
        offloaded.write(b)
        offloaded.flush()
        assert offloaded._writer is not None
    pid = offloaded._writer.pid
    reference = _reference(tmp_path / "ref", batches)
    # A flush does not wait for the child; settle (mon.flush()) does: the rows are on disk.
    assert offloaded.settle(60)
    for name in ("steps.jsonl", "layers.jsonl", "events.jsonl"):
        assert (offloaded.path / name).read_bytes() == (reference / name).read_bytes()
    offloaded.close({"status": "finished"})
    assert offloaded.close_errors == []
    assert offloaded.meta["status"] == "finished"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # it exited at close (and was reaped)
    _same_run(offloaded.path, reference)
    chunks = sorted(os.listdir(offloaded.path / "columns" / "steps"))
    assert len(chunks) >= 2  # the parent's first chunk, then the child's, numbered on


def test_a_small_run_stays_in_process(tmp_path: pathlib.Path) -> None:
    log = RunLogSink.create(tmp_path, "small", {}, offload=True)
    log.write(Batch({"steps": [{"step": 1.0, "loss": 2.0}]}))
    log.flush()
    assert log._writer is None and log._starting is None
    log.close()


def test_a_child_that_never_took_over_is_ended_at_close(offloaded: RunLogSink) -> None:
    offloaded.write(_batches(1)[0])
    starting = offloaded._starting
    assert starting is not None and offloaded._writer is None
    offloaded.close()
    with pytest.raises(ProcessLookupError):
        os.kill(starting.pid, 0)


@pytest.mark.parametrize("when", ["after_flush", "mid_tick", "before_answer"])
def test_a_child_killed_loses_and_doubles_nothing(
    tmp_path: pathlib.Path, offloaded: RunLogSink, when: str
) -> None:
    batches = _batches(60)
    k = _until_handed_over(offloaded, batches)
    batches = batches[: k + 10]
    said: list[str] = []

    def said_once(call: Callable[[], None]) -> None:
        try:
            call()
        except RuntimeError as exc:  # said once; the rows are written here
            said.append(str(exc))

    for i, b in enumerate(batches[k:]):
        said_once(lambda b=b: offloaded.write(b))  # type: ignore[misc]
        if i == 4:
            writer = offloaded._writer
            assert writer is not None
            if when == "after_flush":
                offloaded.flush()
            elif when == "mid_tick":
                # The child has written some of the unconfirmed rows: wait for the file to
                # grow past what it confirmed, then kill it.
                confirmed = offloaded._confirmed
                assert confirmed is not None
                steps = offloaded.path / "steps.jsonl"
                deadline = time.monotonic() + 30
                while steps.stat().st_size <= confirmed["steps"]:
                    assert time.monotonic() < deadline
                    time.sleep(0.001)
            os.kill(writer.pid, signal.SIGKILL)
            if when == "after_flush":
                continue
        said_once(offloaded.flush)
    # A flush does not wait for the child: its death is seen at a later flush or here.
    assert offloaded.settle(30)
    said_once(offloaded.flush)
    assert len(said) == 1 and "writer process" in said[0], said
    assert offloaded._writer is None
    offloaded.close({"status": "finished"})
    assert offloaded.close_errors == []
    _same_run(offloaded.path, _reference(tmp_path / "ref", batches))


def test_a_child_that_stops_answering_is_replaced_within_the_timeout(
    tmp_path: pathlib.Path, offloaded: RunLogSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = _batches(60, rows=2000)  # more than a pipe holds: the parent's send waits
    k = _until_handed_over(offloaded, batches)  # not timed: a loaded machine starts it slowly
    batches = batches[: k + 5]
    writer = offloaded._writer
    assert writer is not None
    monkeypatch.setattr(runlog, "WRITER_TIMEOUT_S", 0.5)
    os.kill(writer.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        said = []
        for b in batches[k:]:
            try:
                offloaded.write(b)
                offloaded.flush()
            except RuntimeError as exc:
                said.append(str(exc))
        assert offloaded.settle(1.0)
        try:
            offloaded.flush()
        except RuntimeError as exc:
            said.append(str(exc))
        assert time.monotonic() - t0 < 30
        assert len(said) == 1 and "writer process" in said[0]
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed by the takeover, as it should
            os.kill(writer.pid, signal.SIGCONT)
    offloaded.close({"status": "finished"})
    assert offloaded.close_errors == []
    _same_run(offloaded.path, _reference(tmp_path / "ref", batches))


def test_close_with_a_stopped_child_is_bounded_and_never_raises(
    tmp_path: pathlib.Path, offloaded: RunLogSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = _batches(60)
    k = _until_handed_over(offloaded, batches)
    batches = batches[: k + 3]
    for b in batches[k:]:
        offloaded.write(b)
    writer = offloaded._writer
    assert writer is not None
    monkeypatch.setattr(runlog, "WRITER_TIMEOUT_S", 0.5)
    os.kill(writer.pid, signal.SIGSTOP)  # it may have written part of the rows, or none
    t0 = time.monotonic()
    offloaded.close({"status": "finished"})
    assert time.monotonic() - t0 < 15
    assert [("writer process" in str(e)) for e in offloaded.close_errors] == [True]
    assert offloaded.meta["status"] == "finished"
    _same_run(offloaded.path, _reference(tmp_path / "ref", batches))


_PARENT = """
import os, signal, sys, time
from nbmonitor.sinks import runlog
from nbmonitor.sinks.base import Batch
runlog.OFFLOAD_VALUES = 1
runlog.OFFLOAD_AFTER_VALUES = 0
log = runlog.RunLogSink.create(sys.argv[1], "killed", {}, offload=True)
tick = 0
while log._writer is None or tick < 5:
    log.write(Batch({"steps": [{"step": float(tick * 100 + i), "loss": 1.0 / (i + 1)}
                               for i in range(100)]}))
    tick += 1
    time.sleep(0.05)
    if log._writer is None or tick < 5:
        log.flush()  # the last tick is sent, not flushed
print(log.path, log._writer.pid, tick, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_training_process_loses_no_row_it_sent(tmp_path: pathlib.Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _PARENT, str(tmp_path)],
        capture_output=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    path, pid, ticks = proc.stdout.decode().split()
    deadline = time.monotonic() + 60
    while True:  # the child sees its input end, writes what it got and exits
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the writer process outlived its parent"
        time.sleep(0.05)
    h = open_run(pathlib.Path(path)).history()
    np.testing.assert_array_equal(h["step"], np.arange(100 * int(ticks), dtype=np.float64))


def test_a_short_run_never_starts_the_writer(tmp_path: pathlib.Path) -> None:
    # 1,600 steps of 3 keys, 1,200 values a tick (over OFFLOAD_VALUES), stay below
    # OFFLOAD_AFTER_VALUES: the process's start would cost
    # its first steps more than the text it would take over.
    log = runlog.RunLogSink.create(tmp_path, "short", {}, offload=True)
    try:
        for tick in range(4):
            rows = [{"step": float(tick * 400 + i), "loss": 1.0, "lr": 1e-3} for i in range(400)]
            log.write(Batch({"steps": rows}))
            log.flush()
        assert log.offloaded is False
        big = [{"step": float(2000 + i), **{f"k{j}": 1.0 for j in range(40)}} for i in range(3000)]
        log.write(Batch({"steps": big}))  # 123,000 values: the writer starts
        assert log.offloaded is True
    finally:
        log.close()


def _held_as_columns(batch: Batch) -> Batch:
    """``batch`` with its steps held as columns, as a live run's come: each run of rows with
    the same keys a ``ColumnRows``, in a ``RowParts``."""
    parts: list[Any] = []
    for row in batch.streams["steps"]:
        if parts and tuple(parts[-1][-1]) == tuple(row):
            parts[-1].append(row)
        else:
            parts.append([row])
    held = RowParts([ColumnRows({k: [r[k] for r in rows] for k in rows[0]}) for rows in parts])
    return Batch({**batch.streams, "steps": held})


def test_steps_held_as_columns_are_sent_as_columns_and_written_to_the_same_bytes(
    tmp_path: pathlib.Path, offloaded: RunLogSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("nbmonitor.runs.sidecar.CHUNK_VALUES", 2000)
    sent: list[object] = []
    send = WriterProcess.send

    def counted(self: WriterProcess, message: Any, timeout: float) -> int:
        sent.append(message)
        return send(self, message, timeout)

    monkeypatch.setattr(WriterProcess, "send", counted)
    batches = _batches(40)
    held = [_held_as_columns(b) for b in batches]
    k = _until_handed_over(offloaded, held)
    for i, b in enumerate(held[k : k + 10]):
        offloaded.write(b)
        offloaded.flush()
        if i == 5:  # the child dies: what it did not confirm is written here, from columns
            writer = offloaded._writer
            assert writer is not None
            os.kill(writer.pid, signal.SIGKILL)
            with contextlib.suppress(RuntimeError):  # said once
                offloaded.settle(30)
                offloaded.flush()
    writes = [m for m in sent if isinstance(m, tuple) and m[0] == "write"]
    assert writes and all(isinstance(m[1]["steps"], RowParts) for m in writes)  # type: ignore[index]
    offloaded.close({"status": "finished"})
    _same_run(offloaded.path, _reference(tmp_path / "ref", batches[: k + 10]))
