"""runs/ and sinks/ work in a Python where torch cannot be imported."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import json, sys
    import nbmonitor, nbmonitor.runs, nbmonitor.sinks
    from nbmonitor.sinks import RunLogSink, Batch
    log = RunLogSink.create(sys.argv[1], "no-torch", {})
    log.write(Batch({"steps": [{"step": 0.0, "loss": 1.0}]}))
    log.close({"status": "closed"})
    run = nbmonitor.open(log.path)
    rows = nbmonitor.list_runs(sys.argv[1]).rows
    t = nbmonitor.runs.Tail(log.path)
    print(json.dumps({"loss": list(run.history()["loss"]), "status": run.status,
                      "rows": len(rows), "polled": len(t.poll()["steps"]),
                      "torch": "torch" in sys.modules}))
    """
)


def test_runs_and_sinks_import_without_torch(tmp_path: pathlib.Path) -> None:
    stub = tmp_path / "stub" / "torch"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('torch is not installed (test stub)')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "stub"), str(REPO)])}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "runs")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts == {"loss": [1.0], "status": "closed", "rows": 1, "polled": 1, "torch": False}
    # and the stub really does refuse: the monitor needs torch
    code = "import nbmonitor; nbmonitor.attach"
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)  # fmt: skip
    assert bad.returncode != 0 and "test stub" in bad.stderr
