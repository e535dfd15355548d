"""Prometheus: an HTTP endpoint with the latest values of a live run, for Grafana.

``prometheus_client`` serves a *private* registry holding one custom collector (the default
registry would raise "Duplicated timeseries" when a notebook cell attaches again). The
collector reads the latest values this sink kept from the rows it was given; nothing is
computed at scrape time and nothing is exported on the training thread. Bound to 127.0.0.1
unless the user passes another address.

Names are ``nbmonitor_<key>`` in base units, as Prometheus' naming guide asks (``_seconds``,
``_bytes``, ``_joules``, ``_watts``, ``_celsius``, ``_hertz``; a percentage is served as a 0-1
``_ratio``: ``cpu_percent`` 42 is ``nbmonitor_cpu_ratio`` 0.42); every series has the labels
``run``, ``rank`` and ``host``; a device series (``gpu{i}_<field>``) is
``nbmonitor_gpu_<field>`` with DCGM-exporter's labels ``gpu``, ``UUID`` and ``Hostname`` so
that it joins a cluster's DCGM series. Steps,
samples, tokens and energy are counters (``_total``), the rest gauges. Per-layer rows are not
served (one series per parameter is a cardinality Prometheus is not for).

**One endpoint per address and port in the process.** Re-running the attach cell opens a new
sink before the old monitor closes: it takes over the endpoint the old one serves (same server,
its collector now reads the new run) instead of failing with "address in use"; the old sink's
close then leaves it alone. The last owner's ``close`` stops the server and frees the port.

**Every rank from rank 0.** In a job, the display rank also follows the other ranks' run files
(``nbmonitor.runs.job.JobTail``, on the sampler side at each flush) and serves their latest
values too, with their own ``rank`` and ``host`` labels.
"""

from __future__ import annotations

import contextlib
import errno
import math
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.exporter import PLACE, ExportContext, ExportError, missing, number

DEFAULT_PORT = 9464
_GPU = re.compile(r"^gpu(\d+)_(.+)$")
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")
# nbmonitor's unit suffixes, as Prometheus' base units (suffix, new suffix, factor).
_UNITS = (
    ("_per_s", "_per_second", 1.0),
    ("_mhz", "_hertz", 1e6),
    ("_s", "_seconds", 1.0),
    ("_w", "_watts", 1.0),
    ("_j", "_joules", 1.0),
    ("_c", "_celsius", 1.0),
    ("_percent", "_ratio", 0.01),  # Prometheus serves ratios 0-1, not percentages
)
_RENAMED = {"step_time": ("step_time_seconds", 1.0)}
# Counters: the steps stream's per-step amounts summed (samples, tokens), and the step count.
_SUMMED = {"samples": "samples", "tokens": "tokens"}


def metric_name(key: str) -> tuple[str, float]:
    """``key``'s Prometheus name (without ``nbmonitor_``) in base units, and the factor from
    nbmonitor's unit to it."""
    if key in _RENAMED:
        return _RENAMED[key]
    name = _UNSAFE.sub("_", key)
    for suffix, base, factor in _UNITS:
        if name.endswith(suffix):
            return name[: -len(suffix)] + base, factor
    return name, 1.0


@dataclass
class RankValues:
    """What is served of one rank: its labels and its latest values."""

    run: str
    rank: str
    host: str
    uuids: Sequence[str] = ()
    steps: dict[str, float] = field(default_factory=dict)  # the latest value of each key
    system: dict[str, float] = field(default_factory=dict)
    step: float = math.nan
    sums: dict[str, float] = field(default_factory=dict)

    def add(self, streams: Mapping[str, Sequence[Mapping[str, object]]]) -> None:
        for row in streams.get("steps", ()):
            for key, value in row.items():
                v = number(value)
                if v is None or key == "time":
                    continue
                if key == "step":
                    self.step = v
                    continue
                self.steps[key] = v
                if key in _SUMMED and math.isfinite(v):
                    self.sums[key] = self.sums.get(key, 0.0) + v
        for row in streams.get("system", ()):
            for key, value in row.items():
                v = number(value)
                if v is not None and key not in PLACE:
                    self.system[key] = v


class Collector:
    """The custom collector: the latest values of every rank, as metric families."""

    def __init__(self, ranks: dict[int, RankValues], lock: threading.Lock) -> None:
        self.ranks = ranks
        self.lock = lock

    def describe(self) -> list[Any]:
        return []  # no families to check at registration: their keys come with the rows

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self.lock:
            ranks = [
                (r.run, r.rank, r.host, list(r.uuids), dict(r.steps), dict(r.system), r.step,
                 dict(r.sums))
                for _, r in sorted(self.ranks.items())
            ]  # fmt: skip
        labels = ["run", "rank", "host"]
        gpu_labels = [*labels, "gpu", "UUID", "Hostname"]
        families: dict[str, Any] = {}

        def family(name: str, kind: str, doc: str, names: list[str]) -> Any:
            fam = families.get(name)
            if fam is None:
                make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                fam = families[name] = make(f"nbmonitor_{name}", doc, labels=names)
            return fam

        for run, rank, host, uuids, steps, system, step, sums in ranks:
            base = [run, rank, host]
            if math.isfinite(step):
                family("steps", "counter", "Optimizer steps completed.", labels).add_metric(
                    base, step
                )
            for key, total in sums.items():
                family(_SUMMED[key], "counter", f"{key} seen so far.", labels).add_metric(
                    base, total
                )
            for key, value in steps.items():
                name, factor = metric_name(key)
                if name in ("steps", *_SUMMED.values()):
                    continue  # served as counters
                family(name, "gauge", f"nbmonitor {key} (latest step)", labels).add_metric(
                    base, value * factor
                )
            for key, value in system.items():
                match = _GPU.match(key)
                if match is None:
                    name, factor = metric_name(key)
                    family(name, "gauge", f"nbmonitor {key}", labels).add_metric(
                        base, value * factor
                    )
                    continue
                index, field_name = int(match.group(1)), match.group(2)
                uuid = uuids[index] if index < len(uuids) else ""
                gpu = [*base, str(index), uuid, host]
                if field_name == "energy_j":
                    if math.isfinite(value):
                        family(
                            "gpu_energy_joules", "counter", "GPU energy since attach.", gpu_labels
                        ).add_metric(gpu, value)
                    continue
                name, factor = metric_name(field_name)
                family(
                    f"gpu_{name}", "gauge", f"nbmonitor GPU {field_name}", gpu_labels
                ).add_metric(gpu, value * factor)
        yield from families.values()


class _Endpoint:
    """One HTTP server of this process and the collector it serves now."""

    def __init__(self, server: Any, thread: threading.Thread, owner: PrometheusSink) -> None:
        self.server = server
        self.thread = thread
        self.owner = owner


# (address, port) -> the endpoint serving it; under _LOCK.
_ENDPOINTS: dict[tuple[str, int], _Endpoint] = {}
_LOCK = threading.Lock()


def endpoints() -> list[tuple[str, int]]:
    """The addresses and ports this process serves now."""
    with _LOCK:
        return sorted(_ENDPOINTS)


class _Switch:
    """The collector registered once per endpoint; it asks its endpoint's owner of the moment."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        with _LOCK:
            endpoint = _ENDPOINTS.get(self.key)
            owner = endpoint.owner if endpoint is not None else None
        if owner is not None:
            yield from owner.collector.collect()


@dataclass(frozen=True)
class Prometheus:
    """Serve the live run's latest values at ``http://ADDR:PORT/metrics`` for Prometheus (and
    Grafana: docs/grafana-dashboard.json). ``addr`` is 127.0.0.1 unless you pass another (such
    as ``"0.0.0.0"`` for a scraper on another machine)."""

    port: int = DEFAULT_PORT
    addr: str = "127.0.0.1"
    name: str = "prometheus"

    def open(self, context: ExportContext) -> PrometheusSink:
        if not context.live:
            raise ExportError(
                "nbmonitor: Prometheus serves a live run; export a run on disk to files, "
                "TensorBoard, W&B, MLflow or trackio instead"
            )
        if (
            not isinstance(self.port, int)
            or isinstance(self.port, bool)
            or not (0 <= self.port < 65536)
        ):
            raise ExportError(f"nbmonitor: Prometheus(port=) must be 0..65535, not {self.port!r}")
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise missing("Prometheus", "prometheus_client", "prometheus") from None
        sink = PrometheusSink(context)
        key = (self.addr, self.port)
        with _LOCK:
            endpoint = _ENDPOINTS.get(key)
            if endpoint is not None:
                endpoint.owner = sink  # a re-run cell: same endpoint, the new run's values
            else:
                registry = CollectorRegistry(auto_describe=False)
                switch = _Switch(key)
                registry.register(switch)
                try:
                    server, thread = start_http_server(self.port, self.addr, registry)
                except OSError as exc:
                    why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
                    raise ExportError(
                        f"nbmonitor: Prometheus cannot serve on {self.addr}:{self.port} ({why}); "
                        "pass nbmonitor.export.Prometheus(port=...) a free port"
                    ) from None
                thread.name = "nbmonitor-prometheus"
                if self.port == 0:  # the port the OS chose
                    key = switch.key = (self.addr, int(server.server_address[1]))
                _ENDPOINTS[key] = _Endpoint(server, thread, sink)
        sink.key = key
        return sink


class PrometheusSink:
    """Keeps the latest values of the run (and, on rank 0 of a job, of the other ranks) for
    the endpoint's collector; ``close`` frees the endpoint if this sink still owns it."""

    name = "prometheus"

    def __init__(self, context: ExportContext) -> None:
        self.key: tuple[str, int] = ("", 0)
        self._lock = threading.Lock()
        self._rank = context.rank if context.rank is not None else 0
        run = context.name.split("/")[0]
        self._values: dict[int, RankValues] = {
            self._rank: RankValues(run, str(self._rank), context.host, list(context.uuids))
        }
        self.collector = Collector(self._values, self._lock)
        self._job: Any = None
        self._run = run
        if context.job_dir is not None and context.rank == 0:
            from nbmonitor.runs.job import JobTail

            self._job = JobTail(context.job_dir, streams=("steps", "system"))
        self._closed = False

    @property
    def port(self) -> int:
        return self.key[1]

    @property
    def url(self) -> str:
        return f"http://{self.key[0]}:{self.key[1]}/metrics"

    def write(self, batch: Batch) -> None:
        with self._lock:
            self._values[self._rank].add(batch.streams)

    def flush(self) -> None:
        if self._job is None:
            return
        new = self._job.poll()
        with self._lock:
            for rank, streams in new.items():
                if rank == self._rank:
                    continue
                values = self._values.get(rank)
                if values is None:
                    meta = self._job.rank_meta(rank)
                    host = meta.get("host") if isinstance(meta.get("host"), str) else ""
                    values = self._values[rank] = RankValues(self._run, str(rank), host)
                values.add(streams)

    def close(self, final_meta: Mapping[str, object]) -> None:
        if self._closed:
            return
        self._closed = True
        with _LOCK:
            endpoint = _ENDPOINTS.get(self.key)
            if endpoint is None or endpoint.owner is not self:
                return  # another run took it over
            del _ENDPOINTS[self.key]
        with contextlib.suppress(Exception):
            endpoint.server.shutdown()
            endpoint.server.server_close()
            endpoint.thread.join(5.0)


__all__ = ["DEFAULT_PORT", "Prometheus", "PrometheusSink", "endpoints", "metric_name"]
