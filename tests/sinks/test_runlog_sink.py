"""The run-log sink: layout, names, meta, errors, one write per batch, surviving SIGKILL
(moved from tests/test_runlog.py), and the sidecar it writes."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tests.runs.runs_helpers import make_log

from nbmonitor.runs import FORMAT_VERSION, RunDirError, open_run
from nbmonitor.runs.format import encode_lines
from nbmonitor.sinks import RunLogSink
from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.runlog import SLICE_ROWS

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_create_makes_the_layout_and_meta(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    try:
        assert log.path.parent == tmp_path / "runs"
        assert re.fullmatch(r"\d{8}-\d{6}-test", log.path.name)
        names = sorted(p.name for p in log.path.iterdir())
        assert names == [
            "events.jsonl",
            "layers.jsonl",
            "memory.jsonl",
            "meta.json",
            "spans.jsonl",
            "steps.jsonl",
            "system.jsonl",
        ]
        meta = json.loads((log.path / "meta.json").read_text())
        assert meta["model"] == "MLP" and meta["parameters"] == 123
        assert meta["format_version"] == FORMAT_VERSION == 1
        assert meta["files"] == {
            "steps": "steps.jsonl",
            "system": "system.jsonl",
            "events": "events.jsonl",
            "layers": "layers.jsonl",
            "spans": "spans.jsonl",
            "memory": "memory.jsonl",
        }
    finally:
        log.close()


def test_default_name_and_unsafe_characters(tmp_path: pathlib.Path) -> None:
    a = RunLogSink.create(tmp_path, None, {})
    b = RunLogSink.create(tmp_path, "my model/v2 ", {})
    try:
        assert a.path.name.endswith("-run")
        assert b.path.parent == tmp_path
        assert b.path.name.endswith("-my-model-v2")
    finally:
        a.close()
        b.close()


def test_name_collisions_get_a_suffix(tmp_path: pathlib.Path) -> None:
    logs = [make_log(tmp_path) for _ in range(3)]
    try:
        names = [log.path.name for log in logs]
        assert len(set(names)) == 3
        # All within one second is the usual case; if the clock ticked over, the stems differ.
        stems = {n.removesuffix("-2").removesuffix("-3") for n in names}
        if len(stems) == 1:
            assert names[1] == names[0] + "-2" and names[2] == names[0] + "-3"
    finally:
        for log in logs:
            log.close()


def test_collision_suffix_with_a_preexisting_folder(tmp_path: pathlib.Path) -> None:
    # Pre-create the next few seconds' names so the collision path is taken for sure.
    root = tmp_path / "runs"
    now = time.time()
    for dt in range(3):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now + dt))
        (root / f"{stamp}-test").mkdir(parents=True, exist_ok=True)
    log = make_log(tmp_path)
    try:
        assert log.path.name.endswith("-test-2")
    finally:
        log.close()


def test_update_meta_rewrites_atomically_and_keeps_fields(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    log.update_meta(status="running")
    log.close()
    log.update_meta(end_time="2024-01-01T00:00:00+00:00", status="closed", errors=[ValueError("x")])
    meta = open_run(log.path).meta
    assert meta["status"] == "closed" and str(meta["end_time"]).startswith("2024")
    assert meta["model"] == "MLP" and meta["format_version"] == 1
    assert meta["errors"] == ["x"]  # odd values are kept as their str, not fatal
    assert not [p for p in log.path.iterdir() if p.name.endswith(".tmp")]


def test_unwritable_run_dir_raises_one_line_hint(tmp_path: pathlib.Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    bad = afile / "sub"  # fails for root too, unlike a chmod'ed folder
    with pytest.raises(RunDirError) as info:
        RunLogSink.create(bad, "x", {})
    msg = str(info.value)
    assert "\n" not in msg
    assert msg == (
        f"nbmonitor: cannot write to run_dir '{bad}' (Not a directory); "
        "pass run_dir= a writable folder."
    )
    assert isinstance(info.value, RuntimeError)


def test_close_is_idempotent_and_writes_after_close_fail(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    log.write_steps([{"step": 0.0}])
    log.close()
    log.close()
    log.flush()  # harmless after close
    with pytest.raises(ValueError, match="closed"):
        log.write_steps([{"step": 1.0}])
    np.testing.assert_array_equal(open_run(log.path).history()["step"], [0.0])


def test_one_write_per_batch(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    calls: list[bytes] = []
    real = log._files["steps"]

    class Spy:
        def write(self, data: bytes) -> int:
            calls.append(data)
            return real.write(data)

    log._files["steps"] = Spy()  # type: ignore[assignment]
    log.write_steps([{"step": float(i)} for i in range(50)])
    log._files["steps"] = real
    log.close()
    assert len(calls) == 1 and calls[0].count(b"\n") == 50


def test_rows_are_encoded_in_slices_with_the_pause_between(tmp_path: pathlib.Path) -> None:
    # A live run's log lets the training thread take the GIL between slices (issue 29); what
    # reaches the disk is the same bytes, in one write.
    taken: list[int] = []
    pauses: list[int] = []

    class Sliced(list):  # type: ignore[type-arg]
        def __getitem__(self, i: object) -> object:
            if isinstance(i, slice):
                taken.append(len(super().__getitem__(i)))
            return super().__getitem__(i)  # type: ignore[index]

    log = RunLogSink.create(tmp_path, "sliced", {}, pause=lambda: pauses.append(sum(taken)))
    written = {"steps": b"", "events": b""}
    # The steps twice: their key set's template is used the second time.
    for stream, row in (("steps", {"step": 0.0}), ("steps", {"step": 1.0}), ("events", {})):
        rows = Sliced(dict(row, n=float(i)) for i in range(2 * SLICE_ROWS + 5))
        taken.clear()
        pauses.clear()
        log.write(Batch({stream: rows}))
        assert taken == [SLICE_ROWS, SLICE_ROWS, 5]
        assert pauses == [SLICE_ROWS, 2 * SLICE_ROWS]
        log.flush()
        written[stream] += encode_lines(rows)
        assert (log.path / f"{stream}.jsonl").read_bytes() == written[stream]
    log.close()


_CHILD = textwrap.dedent(
    """
    import sys, time
    from nbmonitor.sinks.runlog import RunLogSink
    log = RunLogSink.create(sys.argv[1], "killed", {})  # its own pid and host
    print(log.path, flush=True)
    step = 0
    while True:
        log.write_steps([{"step": float(step), "time": time.time(), "loss": 1.0 / (step + 1)}])
        log.flush()
        step += 1
        time.sleep(0.01)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkilled_writer_leaves_a_readable_run(tmp_path: pathlib.Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path / "runs")],
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        path = pathlib.Path(proc.stdout.readline().decode().strip())
        steps = path / "steps.jsonl"
        deadline = time.monotonic() + 60
        while steps.read_bytes().count(b"\n") < 20:
            assert proc.poll() is None, "child exited early"
            assert time.monotonic() < deadline, "child wrote too slowly"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    h = open_run(path).history()
    n = len(h["step"])
    assert n >= 20
    np.testing.assert_array_equal(h["step"], np.arange(n, dtype=np.float64))
    np.testing.assert_allclose(h["loss"], 1.0 / (np.arange(n) + 1))
    assert open_run(path).status == "killed"  # its pid is gone and it never closed


# -- the sidecar -------------------------------------------------------------------------------


def test_chunks_cut_when_due_and_at_close(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbmonitor.runs import sidecar

    monkeypatch.setattr(sidecar, "CHUNK_VALUES", 100)
    log = make_log(tmp_path)
    folder = log.path / "columns" / "steps"
    log.write_steps([{"step": float(i), "loss": 1.0} for i in range(30)])  # 60 values
    log.flush()
    assert not folder.exists()  # not due yet: the text alone holds them
    log.write_steps([{"step": float(i), "loss": 1.0} for i in range(30, 60)])  # 120 values
    log.flush()
    assert [p.name for p in folder.iterdir()] == ["000000.npz"]
    log.write_steps([{"step": 60.0}])
    log.write_events([{"time": 1.0, "message": "events never go to the sidecar"}])
    log.close()
    assert sorted(p.name for p in folder.iterdir()) == ["000000.npz", "000001.npz"]
    assert sorted(p.name for p in (log.path / "columns").iterdir()) == ["steps"]
    with np.load(folder / "000000.npz") as z:
        assert json.loads(z["keys"].tobytes()) == ["step", "loss"] and z["data"].shape == (2, 60)
        assert list(z["span"])[::2] == [0, 60]
    np.testing.assert_array_equal(open_run(log.path).history()["step"], np.arange(61.0))
    assert json.loads((log.path / "meta.json").read_text())["sidecar"] == "columns"


def test_sidecar_that_cannot_be_written_is_given_up(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbmonitor.runs import sidecar

    monkeypatch.setattr(sidecar, "CHUNK_VALUES", 10)
    log = make_log(tmp_path)
    (log.path / "columns").write_text("a file where the folder should be")
    log.write_steps([{"step": float(i)} for i in range(20)])
    with pytest.raises(OSError):
        log.flush()  # raised once: the monitor's guard counts it
    log.write_steps([{"step": float(i)} for i in range(20, 40)])
    log.flush()  # the text log goes on
    log.close()
    assert log.close_errors == []
    np.testing.assert_array_equal(open_run(log.path).history()["step"], np.arange(40.0))


def test_close_never_raises(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    log.write_steps([{"step": 0.0}])
    for f in log._files.values():
        f.close()  # as if the filesystem went away under it
    log.close({"status": "closed"})
    log.close({"status": "closed"})
    assert log.close_errors  # kept, not raised
    assert open_run(log.path).meta["status"] == "closed"


def test_unknown_stream_is_refused(tmp_path: pathlib.Path) -> None:
    from nbmonitor.sinks import Batch

    log = make_log(tmp_path)
    with pytest.raises(ValueError, match="no stream"):
        log.write(Batch({"gantt": [{"x": 1}]}))
    log.close()
