"""Exporters on a live run: what they write equals the run, and one that fails (a port in use,
an unwritable log_dir, W&B refusing the run, a sink raising) costs one line in ``mon.errors``
and nothing else: the loop, the run log and the other exporters go on."""

from __future__ import annotations

import pathlib
import socket
from collections.abc import Mapping

import pytest

torch = pytest.importorskip("torch")

from tests.export.export_helpers import assert_same, wandb_teardown  # noqa: E402

import nbmonitor  # noqa: E402
from nbmonitor.sinks import Batch  # noqa: E402
from nbmonitor.sinks.exporter import ExportContext  # noqa: E402

STEPS = 60


def train(**options: object) -> nbmonitor.Monitor:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, display=False, interval=0.05, layer_every=5, **options)  # type: ignore[arg-type]
    for _ in range(STEPS):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)
    mon.close()
    return mon


def tensorboard(folder: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for prefix in ("train", "system", "layers"):
        if not (folder / prefix).is_dir():
            # A run shorter than one sampler interval has no system rows, hence no folder.
            continue
        acc = EventAccumulator(str(folder / prefix), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out[f"{prefix}/{tag}"] = [(e.step, e.value) for e in acc.Scalars(tag)]
    return out


def test_live_tensorboard_and_files_equal_the_run(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("tensorboard")
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    mon = train(run_dir=tmp_path / "runs", export=["tensorboard", "parquet"])
    assert mon.errors == [] and mon.status == "closed"
    assert len(mon.history()["step"]) == STEPS
    exported = tensorboard(mon.run_dir / "tensorboard")
    assert len(exported["train/loss"]) == STEPS and "layers/grad_norm/0.weight" in exported
    has_system = (mon.run_dir / "system.jsonl").stat().st_size > 0
    assert any(tag.startswith("system/") for tag in exported) == has_system
    assert_same(exported, mon.run_dir, float32=True)
    history = pd.read_parquet(mon.run_dir / "parquet" / "history.parquet")
    assert history["step"].tolist() == mon.history()["step"].tolist()


class Boom:
    """An exporter whose sink raises on every write."""

    name = "boom"

    def open(self, context: ExportContext) -> Boom:
        return self

    def write(self, batch: Batch) -> None:
        raise RuntimeError("the tool went away")

    def flush(self) -> None:
        pass

    def close(self, final_meta: Mapping[str, object]) -> None:
        pass


def test_failing_exporters_fail_alone(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    pytest.importorskip("prometheus_client")
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_ENTITY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: W&B has no login
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "a-file").write_text("")
    request.addfinalizer(wandb_teardown)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        mon = train(
            run_dir=tmp_path / "runs",
            export=[
                nbmonitor.export.Prometheus(port=port),
                nbmonitor.export.TensorBoard(log_dir=tmp_path / "a-file" / "tb"),
                nbmonitor.export.WandB(entity="no-such-entity", mode="online", dir=tmp_path),
                Boom(),
                "csv",
            ],
        )
    lines = mon.errors
    sources = sorted({line.split(" ", 2)[1].rstrip(":") for line in lines})
    assert sources == ["export:prometheus", "export:tensorboard", "export:wandb", "sink:boom"]
    opened = [line for line in lines if " export:" in line]
    assert len(opened) == 3, lines  # one line each, with what to do
    assert any(f"127.0.0.1:{port} (in use)" in line for line in opened)
    assert any("cannot write TensorBoard files" in line for line in opened)
    assert any("W&B did not start a run" in line for line in opened)
    # The loop, the run log and the exporter that works went on.
    run = nbmonitor.open(mon.run_dir)
    assert run.history()["step"].tolist() == [float(s) for s in range(1, STEPS + 1)]
    assert (mon.run_dir / "csv" / "history.csv").exists()


def test_unknown_target_is_refused_at_attach(tmp_path: pathlib.Path) -> None:
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="did you mean 'tensorboard'"):
        nbmonitor.attach(model, run_dir=tmp_path, display=False, export=["tensorbaord"])
    with pytest.raises(ValueError, match="csv more than once"):
        nbmonitor.attach(model, run_dir=tmp_path, display=False, export=["csv", "CSV"])
    with pytest.raises(TypeError, match="export= takes"):
        nbmonitor.attach(model, run_dir=tmp_path, display=False, export=[3])


def test_live_mlflow_without_a_tracking_uri_keeps_every_metric_and_the_config(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``export=["mlflow"]`` with the extra's mlflow-skinny and no MLFLOW_TRACKING_URI: a file
    store in the run folder; a key MLflow's names refuse (``acc@1``) is mapped and costs no
    other metric; the model and optimizer are the run's params."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mon = nbmonitor.attach(
        model, opt, run_dir=tmp_path / "runs", display=False, interval=0.05, export=["mlflow"]
    )
    for _ in range(STEPS):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss, **{"acc@1": 0.5})
    mon.close()
    assert mon.errors == [], mon.errors
    store = mon.run_dir / "mlruns"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's own reader asks for it
    client = MlflowClient(store.as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("nbmonitor").experiment_id])
    assert found.info.status == "FINISHED" and found.info.run_name == mon.name
    history = client.get_metric_history(found.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1))
    acc = client.get_metric_history(found.info.run_id, "train/acc_1")
    assert len(acc) == STEPS and {m.value for m in acc} == {0.5}
    params = found.data.params
    assert params["nbmonitor.model.class"] == "Sequential"
    assert params["nbmonitor.optimizer.class"] == "SGD"
    assert float(params["nbmonitor.optimizer.defaults.lr"]) == 0.01
    assert float(params["nbmonitor.optimizer.defaults.momentum"]) == 0.9


class StalledMLflow:
    """An MLflow tracking server on 127.0.0.1 that answers everything but ``log-batch``, which
    never returns until ``release`` is set (a tracking server that stopped answering)."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        self.release = threading.Event()
        self.batches_asked = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if "get-by-name" in self.path:
                    self._reply({"experiment": {"experiment_id": "1", "name": "nbmonitor",
                                                "lifecycle_stage": "active"}})  # fmt: skip
                else:
                    self._reply({})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.endswith("runs/create"):
                    info = {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1",
                            "status": "RUNNING", "start_time": 1, "lifecycle_stage": "active",
                            "run_name": "stalled", "artifact_uri": ""}  # fmt: skip
                    self._reply({"run": {"info": info, "data": {}}})
                    return
                if self.path.endswith("runs/log-batch"):
                    outer.batches_asked.set()
                    outer.release.wait(300)
                self._reply({})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_stalled_tracking_server_stalls_only_its_exporter(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MLflow's ``log-batch`` never returns: the loop, the run log and TensorBoard go on,
    ``mon.flush()`` still puts every step on disk, and the status names the MLflow export (not
    the run log); close returns within its bound."""
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    import threading
    import time

    server = StalledMLflow()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        mon = nbmonitor.attach(
            model, opt, run_dir=tmp_path / "runs", display=False, interval=0.05,
            export=[nbmonitor.export.MLflow(tracking_uri=server.uri), "tensorboard"],
        )  # fmt: skip
        steps, status = 0, ""
        deadline = time.monotonic() + 120  # a bound for a loaded machine, not a measure
        while "MLflow export hung" not in status and time.monotonic() < deadline:
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log(loss=loss)
            steps += 1
            if steps % 20 == 0:
                status = mon.status
                time.sleep(0.05)
        assert server.batches_asked.is_set()
        assert status.startswith("degraded: MLflow export hung for"), status
        assert "run log" not in status
        assert mon.flush()  # the run log goes on although MLflow hangs
        on_disk = nbmonitor.open(mon.run_dir).history()["step"].tolist()
        assert on_disk == list(range(1, len(on_disk) + 1)) and len(on_disk) >= steps - 1
        mon.close()
        assert mon.status == "closed"
        assert any("sink:mlflow: TimeoutError: MLflow export has not returned" in e
                   for e in mon.errors), mon.errors  # fmt: skip
        assert not any(" runlog" in e or "run log" in e for e in mon.errors), mon.errors
        exported = tensorboard(mon.run_dir / "tensorboard")
        assert [s for s, _ in exported["train/loss"]] == list(range(1, steps + 1))
        assert nbmonitor.open(mon.run_dir).history()["step"].tolist() == list(range(1, steps + 1))
    finally:
        # The server answers again: the exporter's worker sends what waits, closes and ends.
        server.release.set()
        for thread in threading.enumerate():
            if thread.name == "nbmonitor-export-mlflow":
                thread.join(60)
        server.stop()


_SCRIPT = """
import socket, sys, torch, nbmonitor
busy = socket.socket(); busy.bind(("127.0.0.1", 0)); busy.listen()
model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
mon = nbmonitor.attach(model, opt, run_dir=sys.argv[1], export=[
    nbmonitor.export.Prometheus(port=busy.getsockname()[1]),
    nbmonitor.export.TensorBoard(log_dir=sys.argv[2])])
for _ in range(5):
    loss = model(torch.randn(2, 4)).sum(); loss.backward(); opt.step(); opt.zero_grad()
    mon.log(loss=loss)
mon.close()
"""


def test_a_script_says_each_exporter_that_did_not_start(tmp_path: pathlib.Path) -> None:
    """In a script with the default display (the console line), every exporter that cannot
    start is one line naming it, at attach: not only the latest error in the summary."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("prometheus_client")
    import os
    import subprocess
    import sys

    (tmp_path / "a-file").write_text("")
    repo = pathlib.Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "runs"), str(tmp_path / "a-file" / "tb")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    said = [line for line in lines if "did not start" in line]
    assert len(said) == 2, out.stderr
    assert said[0].startswith("nbmonitor: export to prometheus did not start: Prometheus cannot")
    assert said[1].startswith("nbmonitor: export to tensorboard did not start: cannot write")
