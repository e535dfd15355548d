"""The MLflow sink's names: a key MLflow's rules refuse is mapped, and one it still refuses
costs only itself (MLflow fails the whole batch for it)."""

from __future__ import annotations

import pytest

from nbmonitor.sinks import Batch


def test_a_key_mlflow_refuses_costs_only_itself() -> None:
    """MLflow fails a whole log_batch for one name it refuses: the sink sends that batch again
    key by key, says the refused key once and leaves it out from then on."""
    pytest.importorskip("mlflow")
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    from nbmonitor.sinks.exporter import ExportError
    from nbmonitor.sinks.mlflow import MLflowSink, mlflow_name

    class Client:
        def __init__(self) -> None:
            self.logged: list[tuple[str, int]] = []

        def log_batch(self, run_id: str, metrics: object = (), params: object = ()) -> None:
            keys = [m.key for m in metrics]  # type: ignore[attr-defined]
            if "train/refused" in keys:
                raise MlflowException("bad name", INVALID_PARAMETER_VALUE)
            self.logged.extend((m.key, m.step) for m in metrics)  # type: ignore[attr-defined]

    client = Client()
    sink = MLflowSink(client, "r", False, Metric, Param, {})
    rows = [{"step": 1.0, "time": 1.0, "loss": 0.5, "refused": 1.0, "acc@1": 0.9}]
    with pytest.raises(ExportError, match="'train/refused' refused, left out"):
        sink.write(Batch({"steps": rows}))
    assert sorted(client.logged) == [("train/acc_1", 1), ("train/loss", 1)]
    sink.write(Batch({"steps": [{**rows[0], "step": 2.0}]}))  # no error again: left out
    assert sorted(client.logged)[-2:] == [("train/loss", 1), ("train/loss", 2)]
    assert mlflow_name("layers/grad_norm/../x") == "layers/grad_norm/__/x"
    assert mlflow_name("a//b/./c") == "a/b/c" and len(mlflow_name("k" * 300)) == 250
