"""MLflow: every numeric stream as metrics of an MLflow run, through ``MlflowClient.log_batch``.

The run is chosen in ``open``, on the thread that attaches (MLflow's active run is per
thread): the active run if there is one (left open at close), else a new run in
``experiment`` (default ``"nbmonitor"``), ended at close. Rows are sent in batches of at most
1,000 metrics (MLflow's limit for one call), each with its step and its time. Keys:
``train/<key>``, ``system/<key>``, ``layers/<key>``. ``mlflow-skinny`` is enough (extra
``mlflow``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.exporter import ExportContext, ExportError, missing, points, tag

# MLflow refuses more than 1,000 metrics in one log_batch call.
BATCH_METRICS = 1000


@dataclass(frozen=True)
class MLflow:
    """Export to MLflow: into the active run, else a new run in ``experiment`` at
    ``tracking_uri`` (default: MLflow's own, ``MLFLOW_TRACKING_URI``)."""

    tracking_uri: str | None = None
    experiment: str | None = None
    name: str = "mlflow"

    def open(self, context: ExportContext) -> MLflowSink:
        try:
            import mlflow
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise missing("MLflow", "mlflow-skinny", "mlflow") from None
        try:
            active = mlflow.active_run() if self.tracking_uri is None else None
            if active is not None:
                return MLflowSink(MlflowClient(), active.info.run_id, False, Metric)
            client = MlflowClient(self.tracking_uri)
            experiment = self.experiment or "nbmonitor"
            found = client.get_experiment_by_name(experiment)
            exp_id = (
                found.experiment_id if found is not None else client.create_experiment(experiment)
            )
            tags = {"nbmonitor.host": context.host}
            if context.rank is not None:
                tags["nbmonitor.rank"] = str(context.rank)
            run = client.create_run(exp_id, run_name=context.label, tags=tags)
        except Exception as exc:
            text = " ".join(str(exc).split())[:300]
            raise ExportError(f"nbmonitor: MLflow did not start a run ({text})") from None
        return MLflowSink(client, run.info.run_id, True, Metric)


class MLflowSink:
    """Sends each tick's rows to one MLflow run with ``log_batch``."""

    name = "mlflow"

    def __init__(self, client: Any, run_id: str, started: bool, metric: Any) -> None:
        self.client = client
        self.run_id = run_id
        self.started = started
        self._metric = metric
        self._closed = False

    def write(self, batch: Batch) -> None:
        if self._closed:
            return
        metric, now = self._metric, time.time()
        metrics = [
            metric(tag(p.stream, k), v, int((p.time if p.time is not None else now) * 1000), p.step)
            for p in points(batch.streams)
            for k, v in p.values.items()
        ]
        for start in range(0, len(metrics), BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + BATCH_METRICS])

    def flush(self) -> None:
        pass  # each write is sent

    def close(self, final_meta: Mapping[str, object]) -> None:
        if self._closed:
            return
        self._closed = True
        if self.started:
            status = "FAILED" if final_meta.get("status") == "degraded" else "FINISHED"
            with contextlib.suppress(Exception):
                self.client.set_terminated(self.run_id, status=status)


__all__ = ["MLflow", "MLflowSink"]
