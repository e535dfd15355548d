"""Each exporter's copy of a run, read back by the tool's own reader (TensorBoard's
EventAccumulator, W&B's reader of its .wandb file, MlflowClient on a file store, trackio's
SQLite, pandas on Parquet and CSV), equals the run for every exported key and step."""

from __future__ import annotations

import json
import math
import os
import pathlib
import sqlite3
import subprocess
import sys
import textwrap
from collections import defaultdict

import numpy as np
import pytest
from tests.export.export_helpers import STEPS, assert_same, make_run, wandb_teardown

import nbmonitor
from nbmonitor.export import export_run

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_tensorboard_event_accumulator_reads_back_every_key_and_step(
    tmp_path: pathlib.Path,
) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = make_run(tmp_path / "runs")
    done = export_run(path, "tensorboard", log_dir=tmp_path / "tb")
    assert [d.where for d in done] == [str(tmp_path / "tb")]
    exported: dict[str, list[tuple[int, float]]] = {}
    for prefix in ("train", "system", "layers"):
        acc = EventAccumulator(str(tmp_path / "tb" / prefix), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            exported[f"{prefix}/{tag}"] = [(e.step, e.value) for e in acc.Scalars(tag)]
    assert len(exported["train/loss"]) == STEPS
    assert_same(exported, path, float32=True)  # TensorBoard scalars are float32


def test_tensorboard_default_folder_is_inside_the_run(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("tensorboard")
    path = make_run(tmp_path / "runs")
    (out,) = nbmonitor.open(path).export("tensorboard")
    assert out == path / "tensorboard"
    assert sorted(p.name for p in out.iterdir()) == ["layers", "system", "train"]


def test_pandas_parquet_and_csv_equal_the_run(tmp_path: pathlib.Path) -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = make_run(tmp_path / "runs")
    run = nbmonitor.open(path)
    frames = run.to_pandas()
    assert sorted(frames) == ["events", "history", "layers", "system"]
    tables = {"history": run.history(), "system": run.system(), "layers": run.layers()}
    parquet = {p.name for p in run.to_parquet(tmp_path / "pq")}
    csv = {p.name for p in run.to_csv(tmp_path / "csv")}
    assert parquet == {f"{t}.parquet" for t in [*tables, "events"]}
    assert csv == {f"{t}.csv" for t in [*tables, "events"]}
    for table, cols in tables.items():
        for frame in (
            frames[table],
            pd.read_parquet(tmp_path / "pq" / f"{table}.parquet"),
            pd.read_csv(tmp_path / "csv" / f"{table}.csv"),
        ):
            assert list(frame.columns) == list(cols)
            for key, col in cols.items():
                np.testing.assert_array_equal(frame[key].to_numpy(np.float64), col, err_msg=key)
    events = pd.read_parquet(tmp_path / "pq" / "events.parquet")
    assert events["rule"].tolist() == [e["rule"] for e in run.events()]
    assert events["step"].tolist() == [e["step"] for e in run.events()]


def _wandb_history(folder: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """The history rows of the one offline run under ``folder``, read with W&B's own reader
    of its .wandb transaction log."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (log,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    store = datastore.DataStore()
    store.open_for_scan(str(log))
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    try:
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") != "history":
                continue
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            row = {k: v for k, v in row.items() if not k.startswith("_")}  # W&B's own
            if not row:
                continue
            step = row.pop("nbmonitor/step")
            for key, value in row.items():
                out[key].append((step, value))
    finally:
        store.close()
    return out


def test_wandb_offline_run_reads_back_every_key_and_step(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    pytest.importorskip("wandb.sdk.internal.datastore")
    for key in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")  # as a user without a network sets it
    monkeypatch.setenv("WANDB_SILENT", "true")
    path = make_run(tmp_path / "runs")
    request.addfinalizer(wandb_teardown)
    nbmonitor.open(path).export("wandb", dir=tmp_path)
    assert_same(_wandb_history(tmp_path), path)


def test_mlflow_file_store_reads_back_every_key_and_step(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    path = make_run(tmp_path / "runs")
    (done,) = export_run(path, "mlflow", tracking_uri=uri, experiment="exp")
    client = MlflowClient(uri)
    run_id = done.where.split()[-1]
    info = client.get_run(run_id)
    assert info.info.status == "FINISHED" and info.info.run_name == path.name
    exported = {}
    for key in info.data.metrics:
        history = client.get_metric_history(run_id, key)
        exported[key] = [(m.step, m.value) for m in sorted(history, key=lambda m: m.timestamp)]
    assert_same(exported, path)


_TRACKIO = textwrap.dedent(
    """
    import sys
    from nbmonitor.export import export_run
    export_run(sys.argv[1], "trackio", project="exp")
    """
)


def test_trackio_sqlite_reads_back_every_key_and_step(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("trackio")
    path = make_run(tmp_path / "runs")
    # trackio reads TRACKIO_DIR when it is imported: a child process with its own.
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _TRACKIO, str(path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(tmp_path / "trackio" / "exp.db") as db:
        rows = db.execute(
            "SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY id", (path.name,)
        ).fetchall()
    exported: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for step, metrics in rows:
        for key, value in json.loads(metrics).items():
            # trackio stores JSON: a NaN comes back as null or as the text "NaN"
            exported[key].append((step, math.nan if value is None else float(value)))
    assert_same(exported, path)
