"""MLflow: every numeric stream as metrics of an MLflow run, through ``MlflowClient.log_batch``,
and the run's configuration as its params.

The run is chosen in ``open``, on the thread that attaches (MLflow's active run is per
thread): the active run if there is one (left open at close), else a new run in
``experiment`` (default ``"nbmonitor"``), ended at close. The store of a new run is
``tracking_uri``, else MLflow's own when one is set (``MLFLOW_TRACKING_URI``,
``mlflow.set_tracking_uri``), else a file store in the run folder, ``<run>/mlruns`` (``./mlruns``
for a run without a folder): MLflow's own default, a SQLite database, needs SQLAlchemy, which
the ``mlflow-skinny`` of the extra does not have. MLflow 3 opens a file store only when
``MLFLOW_ALLOW_FILE_STORE`` is true: nbmonitor sets it while it opens one (read the store back
with ``MLFLOW_ALLOW_FILE_STORE=true`` set, or ``mlflow ui --backend-store-uri <run>/mlruns``).

Rows are sent in batches of at most 1,000 metrics (MLflow's limit for one call), each with its
step and its time. Keys: ``train/<key>``, ``system/<key>``, ``layers/<key>``, each character
MLflow's names refuse (outside letters, digits, ``_ - . / : `` and space) made ``_``
(``train/acc@1`` is ``train/acc_1``; a name taken already gets ``_2``, ``_3``...). A key MLflow
still refuses costs only itself: it is reported once and left out. The params are the run's
configuration as W&B's config has it (``nbmonitor.model.class``,
``nbmonitor.optimizer.defaults.lr``, ...), sent with the first rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.exporter import ExportContext, ExportError, config, missing, points, tag

# MLflow refuses more than 1,000 metrics, or 100 params, in one log_batch call.
BATCH_METRICS = 1000
BATCH_PARAMS = 100
# MLflow's longest key, and its longest param value.
MAX_KEY = 250
MAX_PARAM_VALUE = 6000
# What MLflow's metric and param names may hold (mlflow.utils.validation, off Windows).
_REFUSED = re.compile(r"[^/\w.\- :]")
_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"


def mlflow_name(key: str) -> str:
    """``key`` as a name MLflow takes: refused characters ``_``, no empty, ``.`` or ``..``
    path part (MLflow refuses a name that resolves to another path), at most 250 characters."""
    parts = [p for p in _REFUSED.sub("_", key).split("/") if p not in ("", ".")]
    name = "/".join("__" if p == ".." else p for p in parts) or "_"
    return name[:MAX_KEY]


def params(meta: Mapping[str, object]) -> dict[str, str]:
    """The run's configuration (``exporter.config``) as MLflow params: one per leaf, named by
    its path (``nbmonitor.optimizer.defaults.lr``), lists as JSON."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
            return
        if isinstance(value, str):
            text = value
        elif isinstance(value, (list, tuple)):
            text = json.dumps(value, default=str)
        else:
            text = str(value)
        out[mlflow_name(prefix)] = text[:MAX_PARAM_VALUE]

    walk("nbmonitor", config(meta))
    return out


@contextlib.contextmanager
def _file_store_allowed(uri: str | None) -> Iterator[None]:
    """MLflow 3 opens a file store only with MLFLOW_ALLOW_FILE_STORE set; set it while the
    store is opened (MLflow keeps the store it opened, one per URI)."""
    if uri is None or not uri.startswith("file:") or os.environ.get(_ALLOW_FILE_STORE):
        yield
        return
    os.environ[_ALLOW_FILE_STORE] = "true"
    try:
        yield
    finally:
        os.environ.pop(_ALLOW_FILE_STORE, None)


def _tracking_uri_set() -> bool:
    """Whether the user chose MLflow's store (``MLFLOW_TRACKING_URI``, ``set_tracking_uri``)."""
    try:
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set
    except ImportError:  # a later MLflow without it: the environment variable at least
        return bool(os.environ.get("MLFLOW_TRACKING_URI"))
    return bool(is_tracking_uri_set())  # type: ignore[no-untyped-call]


def default_store(context: ExportContext) -> pathlib.Path:
    """Where a new run goes when no tracking URI is set: ``mlruns`` in the run's folder (the
    job's, for a job), else in the working directory."""
    folder = context.job_dir or context.run_dir
    return (folder if folder is not None else pathlib.Path.cwd()) / "mlruns"


@dataclass(frozen=True)
class MLflow:
    """Export to MLflow: into the active run, else a new run in ``experiment`` at
    ``tracking_uri`` (default: MLflow's own if set, else a file store ``<run>/mlruns``)."""

    tracking_uri: str | None = None
    experiment: str | None = None
    name: str = "mlflow"

    def open(self, context: ExportContext) -> MLflowSink:
        try:
            import mlflow
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise missing("MLflow", "mlflow-skinny", "mlflow") from None
        store: pathlib.Path | None = None
        uri = self.tracking_uri
        if uri is not None and "://" not in uri and not uri.startswith("file:"):
            uri = pathlib.Path(uri).resolve().as_uri()  # a folder: a file store there
        try:
            active = mlflow.active_run() if self.tracking_uri is None else None
            if active is not None:
                client = MlflowClient()
                return MLflowSink(client, active.info.run_id, False, Metric, Param, context.meta)
            if uri is None and not _tracking_uri_set():
                store = default_store(context)
                uri = store.resolve().as_uri()
            with _file_store_allowed(uri):
                client = MlflowClient(uri)
                experiment = self.experiment or "nbmonitor"
                found = client.get_experiment_by_name(experiment)
                exp_id = (
                    found.experiment_id
                    if found is not None
                    else client.create_experiment(experiment)
                )
                tags = {"nbmonitor.host": context.host}
                if context.rank is not None:
                    tags["nbmonitor.rank"] = str(context.rank)
                run = client.create_run(exp_id, run_name=context.label, tags=tags)
        except Exception as exc:
            text = " ".join(str(exc).split())[:300]
            raise ExportError(f"nbmonitor: MLflow did not start a run ({text})") from None
        sink = MLflowSink(client, run.info.run_id, True, Metric, Param, context.meta)
        sink.store = store
        return sink


class MLflowSink:
    """Sends each tick's rows to one MLflow run with ``log_batch``; the run's params with the
    first rows."""

    name = "mlflow"

    def __init__(
        self,
        client: Any,
        run_id: str,
        started: bool,
        metric: Any,
        param: Any,
        meta: Mapping[str, object],
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.started = started
        self.store: pathlib.Path | None = None  # the file store nbmonitor chose, if it did
        self._metric = metric
        self._param = param
        self._params: dict[str, str] | None = params(meta)  # None once sent
        self._names: dict[str, str] = {}  # our tag -> its MLflow name
        self._taken: set[str] = set()
        self._refused: set[str] = set()  # MLflow names MLflow refused: left out from then on
        self._closed = False

    @property
    def where(self) -> str:
        run = f"run {self.run_id}"
        return f"{self.store}, {run}" if self.store is not None else run

    def _name(self, stream: str, key: str) -> str:
        full = tag(stream, key)
        name = self._names.get(full)
        if name is None:
            name = base = mlflow_name(full)
            n = 1
            while name in self._taken:  # two keys made one name: the later one numbered
                n += 1
                name = f"{base[: MAX_KEY - len(str(n)) - 1]}_{n}"
            self._names[full] = name
            self._taken.add(name)
        return name

    def write(self, batch: Batch) -> None:
        if self._closed:
            return
        problems = []
        if self._params is not None:
            sent, self._params = self._params, None
            items = [self._param(k, v) for k, v in sent.items()]
            for start in range(0, len(items), BATCH_PARAMS):
                try:
                    self.client.log_batch(self.run_id, params=items[start : start + BATCH_PARAMS])
                except Exception as exc:  # a param set before to another value: not the rows
                    problems.append(f"params not logged ({_short(exc)})")
                    break
        metric, now = self._metric, time.time()
        metrics = []
        for p in points(batch.streams):
            stamp = int((p.time if p.time is not None else now) * 1000)
            for k, v in p.values.items():
                name = self._name(p.stream, k)
                if name not in self._refused:
                    metrics.append(metric(name, v, stamp, p.step))
        for start in range(0, len(metrics), BATCH_METRICS):
            part = metrics[start : start + BATCH_METRICS]
            try:
                self.client.log_batch(self.run_id, metrics=part)
            except Exception as exc:
                if getattr(exc, "error_code", None) != "INVALID_PARAMETER_VALUE":
                    raise
                problems.extend(self._one_key_at_a_time(part))
        if problems:
            raise ExportError("nbmonitor: MLflow: " + "; ".join(problems))

    def _one_key_at_a_time(self, metrics: list[Any]) -> list[str]:
        """A batch MLflow refused, sent again one key at a time: a key it refuses costs only
        itself (reported once, left out from then on)."""
        by_key: dict[str, list[Any]] = {}
        for m in metrics:
            by_key.setdefault(m.key, []).append(m)
        problems = []
        for key, group in by_key.items():
            try:
                self.client.log_batch(self.run_id, metrics=group)
            except Exception as exc:
                if getattr(exc, "error_code", None) != "INVALID_PARAMETER_VALUE":
                    raise
                self._refused.add(key)
                problems.append(f"{key!r} refused, left out ({_short(exc)})")
        return problems

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


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


__all__ = ["MLflow", "MLflowSink", "default_store", "mlflow_name", "params"]
