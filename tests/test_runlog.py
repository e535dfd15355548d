"""The run directory: layout, round-trips, torn lines, errors, and surviving SIGKILL."""

from __future__ import annotations

import json
import math
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

from nbmonitor._runlog import FORMAT_VERSION, Run, RunDirError, RunLog, open_run

REPO = pathlib.Path(__file__).resolve().parents[1]


def _log(tmp_path: pathlib.Path, name: str | None = "test") -> RunLog:
    return RunLog.create(tmp_path / "runs", name, {"model": "MLP", "parameters": 123})


def test_create_makes_the_layout_and_meta(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
    try:
        assert log.path.parent == tmp_path / "runs"
        assert re.fullmatch(r"\d{8}-\d{6}-test", log.path.name)
        names = sorted(p.name for p in log.path.iterdir())
        assert names == [
            "events.jsonl",
            "layers.jsonl",
            "meta.json",
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
        }
    finally:
        log.close()


def test_default_name_and_unsafe_characters(tmp_path: pathlib.Path) -> None:
    a = RunLog.create(tmp_path, None, {})
    b = RunLog.create(tmp_path, "my model/v2 ", {})
    try:
        assert a.path.name.endswith("-run")
        assert b.path.parent == tmp_path
        assert b.path.name.endswith("-my-model-v2")
    finally:
        a.close()
        b.close()


def test_name_collisions_get_a_suffix(tmp_path: pathlib.Path) -> None:
    logs = [_log(tmp_path) for _ in range(3)]
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
    log = _log(tmp_path)
    try:
        assert log.path.name.endswith("-test-2")
    finally:
        log.close()


def test_reader_sees_flushed_rows_while_the_run_is_open(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
    try:
        log.write_steps([{"step": 0.0, "time": 1.0, "loss": 2.5}])
        log.write_steps([{"step": 1.0, "time": 2.0, "loss": 2.0, "grad_norm/layer1.weight": 0.5}])
        log.write_samples([{"time": 1.5, "step": 0.0, "cpu_percent": 50.0}])
        log.write_events([{"time": 1.7, "kind": "alert", "rule": "nan", "layers": ["a", "b"]}])
        log.flush()
        run = open_run(log.path)
        assert isinstance(run, Run)
        assert run.meta["model"] == "MLP"
        h = run.history()
        assert list(h) == ["step", "time", "loss", "grad_norm/layer1.weight"]
        np.testing.assert_array_equal(h["step"], [0.0, 1.0])
        np.testing.assert_array_equal(h["loss"], [2.5, 2.0])
        np.testing.assert_array_equal(h["grad_norm/layer1.weight"], [np.nan, 0.5])
        assert all(v.dtype == np.float64 for v in h.values())
        np.testing.assert_array_equal(run.system()["cpu_percent"], [50.0])
        assert run.events() == [{"time": 1.7, "kind": "alert", "rule": "nan", "layers": ["a", "b"]}]
        # More rows after the first read show up on the next one.
        log.write_steps([{"step": 2.0, "time": 3.0, "loss": 1.0}])
        log.flush()
        np.testing.assert_array_equal(run.history()["step"], [0.0, 1.0, 2.0])
    finally:
        log.close()


def test_nonfinite_values_round_trip_exactly(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
    values = [math.nan, math.inf, -math.inf, 0.1, -0.0, 1e-310, 1.7976931348623157e308]
    log.write_steps([{"step": float(i), "v": v} for i, v in enumerate(values)])
    log.write_steps([{"step": 99.0, "v": np.float64(3.25)}])  # numpy scalars too
    log.close()
    v = open_run(log.path).history()["v"]
    assert math.isnan(v[0])
    assert v[1] == math.inf and v[2] == -math.inf
    assert v[3] == 0.1 and math.copysign(1.0, v[4]) == -1.0
    assert v[5] == 1e-310 and v[6] == 1.7976931348623157e308
    assert v[7] == 3.25
    text = (log.path / "steps.jsonl").read_text()
    assert "NaN" in text and "Infinity" in text and "-Infinity" in text


def test_torn_last_line_is_skipped(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
    log.write_steps([{"step": float(i), "loss": 1.0} for i in range(3)])
    log.close()
    steps = log.path / "steps.jsonl"
    with open(steps, "ab") as f:
        f.write(b'{"step":3.0,"lo')  # a write cut off by a kill: no newline
    np.testing.assert_array_equal(open_run(log.path).history()["step"], [0, 1, 2])
    with open(steps, "ab") as f:
        f.write(b"ss\x00garbage\n")  # completed with a newline but unparsable: still the last
    np.testing.assert_array_equal(open_run(log.path).history()["step"], [0, 1, 2])


def test_corrupt_line_in_the_middle_raises(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
    log.close()
    (log.path / "steps.jsonl").write_bytes(b'{"step":0}\nnot json\n{"step":2}\n')
    with pytest.raises(ValueError, match="line 2"):
        open_run(log.path).history()


def test_empty_run_reads_empty(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
    try:
        run = open_run(log.path)
        assert run.history() == {} and run.system() == {} and run.events() == []
    finally:
        log.close()


def test_update_meta_rewrites_atomically_and_keeps_fields(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
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
        RunLog.create(bad, "x", {})
    msg = str(info.value)
    assert "\n" not in msg
    assert msg == (
        f"nbmonitor: cannot write to run_dir '{bad}' (Not a directory); "
        "pass run_dir= a writable folder."
    )
    assert isinstance(info.value, RuntimeError)


def test_close_is_idempotent_and_writes_after_close_fail(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
    log.write_steps([{"step": 0.0}])
    log.close()
    log.close()
    log.flush()  # harmless after close
    with pytest.raises(ValueError, match="closed"):
        log.write_steps([{"step": 1.0}])
    np.testing.assert_array_equal(open_run(log.path).history()["step"], [0.0])


def test_one_write_per_batch(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
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


def test_open_missing_run_says_what_to_do(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match="no run at"):
        open_run(tmp_path / "nope")


_CHILD = textwrap.dedent(
    """
    import sys, time
    from nbmonitor._runlog import RunLog
    log = RunLog.create(sys.argv[1], "killed", {"pid": 0})
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


def test_layer_rows_round_trip(tmp_path: pathlib.Path) -> None:
    log = _log(tmp_path)
    try:
        log.write_layers([{"step": 10.0, "update_ratio/fc.weight": 1e-3}])
        log.flush()
        layers = open_run(log.path).layers()
        assert list(layers["step"]) == [10.0]
        assert layers["update_ratio/fc.weight"][0] == 1e-3
    finally:
        log.close()
