"""From disk, without torch: ``nbmonitor export RUN --to ...`` with its progress bar, for a
finished run, a job (every rank) and a run still being written."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
from tests.export.export_helpers import STEPS, make_run

import nbmonitor
from nbmonitor.sinks import Batch, RunLogSink

REPO = pathlib.Path(__file__).resolve().parents[2]


def no_torch_env(tmp_path: pathlib.Path) -> dict[str, str]:
    """An environment whose ``import torch`` fails (a stub first on the path)."""
    stub = tmp_path / "stub" / "torch"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text("raise ImportError('torch is not installed (test stub)')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "stub"), str(REPO)])}


def cli(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = no_torch_env(tmp_path)
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):  # as on a fresh machine
        env.pop(key, None)
    return subprocess.run(
        [sys.executable, "-m", "nbmonitor", "export", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip


def test_cli_exports_a_run_without_torch_with_a_progress_bar(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("tensorboard")
    path = make_run(tmp_path / "runs")
    out = cli(tmp_path, str(path), "--to", "tensorboard", "--out", str(tmp_path / "tb"))
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.strip() == f"nbmonitor export: {path.name} -> tensorboard: {tmp_path / 'tb'}"
    assert "] 100% " in out.stderr and f"{path.name} -> tensorboard [" in out.stderr
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["layers", "system", "train"]


def test_cli_exports_to_mlflow_without_a_tracking_uri(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mlflow-skinny cannot open MLflow's default (SQLite) store: with no MLFLOW_TRACKING_URI the
    run goes to a file store in the run folder, read back by MLflow's own client."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tests.export.export_helpers import assert_same

    path = make_run(tmp_path / "runs")
    out = cli(tmp_path, str(path), "--to", "mlflow")
    assert out.returncode == 0, out.stderr + out.stdout
    store = path / "mlruns"
    assert out.stdout.strip().startswith(f"nbmonitor export: {path.name} -> mlflow: {store}, run ")
    run_id = out.stdout.split()[-1]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(store.as_uri())
    info = client.get_run(run_id)
    assert info.info.status == "FINISHED"
    exported = {}
    for key in info.data.metrics:
        history = client.get_metric_history(run_id, key)
        exported[key] = [(m.step, m.value) for m in sorted(history, key=lambda m: m.timestamp)]
    assert_same(exported, path)
    assert info.data.params["nbmonitor.host"] == "box"


def test_cli_says_what_is_wrong_in_one_line(tmp_path: pathlib.Path) -> None:
    path = make_run(tmp_path / "runs")
    bad = cli(tmp_path, str(path), "--to", "tensorbaord")
    assert bad.returncode == 1
    assert bad.stdout.strip().splitlines() == [
        "nbmonitor: unknown export target 'tensorbaord'; did you mean 'tensorboard'? choose "
        "from tensorboard, wandb, mlflow, trackio, prometheus, parquet, csv"
    ]
    live_only = cli(tmp_path, str(path), "--to", "prometheus")
    assert live_only.returncode == 1 and "Prometheus serves a live run" in live_only.stdout
    missing = cli(tmp_path, str(tmp_path / "nothing"), "--to", "csv")
    assert missing.returncode == 1 and "no run at" in missing.stdout
    assert "Traceback" not in bad.stderr + live_only.stderr + missing.stderr


def test_a_job_exports_every_rank(tmp_path: pathlib.Path) -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    for rank in (0, 1):
        log = RunLogSink.create(
            tmp_path / "runs", "ddp", {"rank": rank, "world_size": 2}, job_id="j1", rank=rank,
            world_size=2,
        )  # fmt: skip
        log.write(Batch({"steps": [{"step": float(s), "loss": rank + s} for s in (1, 2, 3)]}))
        log.close({"status": "closed", "steps": 3})
    job = log.path.parent
    out = cli(tmp_path, str(job), "--to", "parquet", "--out", str(tmp_path / "pq"))
    assert out.returncode == 0, out.stderr + out.stdout
    assert len(out.stdout.strip().splitlines()) == 2
    for rank in (0, 1):
        history = pd.read_parquet(tmp_path / "pq" / f"rank{rank}" / "history.parquet")
        assert history["loss"].tolist() == [rank + 1.0, rank + 2.0, rank + 3.0]
    opened = nbmonitor.open(job)
    assert [p.parent.name for p in opened.to_csv(tmp_path / "csv")] == ["rank0", "rank1"]


def test_a_run_still_being_written_exports_what_is_on_disk(tmp_path: pathlib.Path) -> None:
    pd = pytest.importorskip("pandas")
    path = make_run(tmp_path / "runs", close=False)
    with open(path / "steps.jsonl", "ab") as f:
        f.write(b'{"step": 999999, "lo')  # a write in progress: left for later
    assert nbmonitor.open(path).status == "running"
    out = cli(tmp_path, str(path), "--to", "csv", "--out", str(tmp_path / "csv"))
    assert out.returncode == 0, out.stderr + out.stdout
    history = pd.read_csv(tmp_path / "csv" / "history.csv")
    assert history["step"].tolist() == list(range(1, STEPS + 1))


_NO_TORCH = textwrap.dedent(
    """
    import json, sys
    import nbmonitor
    run = nbmonitor.open(sys.argv[1])
    run.export("tensorboard", log_dir=sys.argv[2])
    frames = run.to_pandas()
    print(json.dumps({"rows": len(frames["history"]), "torch": "torch" in sys.modules}))
    """
)


def test_the_python_api_needs_no_torch(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("pandas")
    path = make_run(tmp_path / "runs")
    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, str(path), str(tmp_path / "tb")],
        capture_output=True, text=True, env=no_torch_env(tmp_path), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"rows": STEPS, "torch": False}
