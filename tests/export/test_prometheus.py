"""Prometheus: the endpoint scraped by a real Prometheus server (Debian's ``prometheus``,
started here on 127.0.0.1), its exposition checked by ``promtool``, DCGM-style device labels,
and a notebook cell attached again and again keeping one endpoint."""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("prometheus_client")

from tests.required import missing_tool  # noqa: E402

import nbmonitor  # noqa: E402
from nbmonitor.sinks import Batch  # noqa: E402
from nbmonitor.sinks.exporter import ExportContext  # noqa: E402
from nbmonitor.sinks.prometheus import Prometheus, endpoints, metric_name  # noqa: E402

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NO_SERVER = "Debian's prometheus is not installed (apt-get install prometheus)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        data: bytes = r.read()
        return data


def wait_for(check: object, what: str, timeout: float = 90.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()  # type: ignore[operator]
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def train(mon: object, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)  # type: ignore[attr-defined]


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[tuple[str, int]]:
    """A Prometheus server on 127.0.0.1 scraping 127.0.0.1:<target> every 0.5 s; yields its
    API address and the target port."""
    if PROMETHEUS is None:
        missing_tool(NO_SERVER)
    target, port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 500ms\n"
        "scrape_configs:\n  - job_name: nbmonitor\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
    )
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        api = f"http://127.0.0.1:{port}"
        wait_for(lambda: get(f"{api}/-/ready"), "the Prometheus server")
        yield api, target
    finally:
        proc.terminate()
        proc.wait(30)


def query(api: str, promql: str) -> list[dict[str, object]]:
    data = json.loads(get(f"{api}/api/v1/query?query={urllib.parse.quote(promql)}"))
    assert data["status"] == "success", data
    result: list[dict[str, object]] = data["data"]["result"]
    return result


def test_a_real_prometheus_scrapes_the_run_with_its_labels(
    server: tuple[str, int], tmp_path: pathlib.Path
) -> None:
    api, port = server
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(
        model, opt, run_dir=tmp_path / "runs", display=False, interval=0.2,
        export=[nbmonitor.export.Prometheus(port=port)],
    )  # fmt: skip
    try:
        train(mon, model, opt, 20)
        mon.flush()

        def scraped() -> list[dict[str, object]]:
            train(mon, model, opt, 2)
            return [s for s in query(api, "nbmonitor_steps_total") if float(s["value"][1]) >= 20]  # type: ignore[index]

        (series,) = wait_for(scraped, "nbmonitor_steps_total in Prometheus")  # type: ignore[misc]
        labels = series["metric"]
        assert labels["run"] == mon.name and labels["rank"] == "0"
        assert labels["host"] == socket.gethostname() and labels["job"] == "nbmonitor"
        for name in ("nbmonitor_loss", "nbmonitor_step_time_seconds", "nbmonitor_samples_total",
                     "nbmonitor_cpu_ratio", "nbmonitor_process_rss_bytes"):  # fmt: skip
            (found,) = query(api, name)
            assert found["metric"]["run"] == mon.name, name  # type: ignore[index]
        # Percentages are 0-1 ratios under base-unit names (Prometheus' naming guide).
        (cpu,) = query(api, "nbmonitor_cpu_ratio")
        assert 0.0 <= float(cpu["value"][1]) <= 1.0  # type: ignore[index]
        assert query(api, '{__name__=~"nbmonitor_.*_percent"}') == []
        assert query(api, 'up{job="nbmonitor"}')[0]["value"][1] == "1"  # type: ignore[index]
        assert mon.errors == []
    finally:
        mon.close()
    assert endpoints() == []


def test_promtool_finds_the_exposition_clean_with_dcgm_labels(tmp_path: pathlib.Path) -> None:
    if PROMTOOL is None:
        missing_tool(NO_SERVER)
    context = ExportContext(
        "20240101-000000-run", tmp_path, {"host": "node7"}, uuids=["GPU-1234", "GPU-5678"]
    )
    sink = Prometheus(port=0).open(context)
    try:
        sink.write(
            Batch(
                {
                    "steps": [
                        {
                            "step": 3.0,
                            "time": 1.0,
                            "loss": 0.5,
                            "samples": 8.0,
                            "tokens": 512.0,
                            "step_time": 0.2,
                            "phase_forward_s": 0.1,
                            "samples_per_s": 40.0,
                        }
                    ],
                    "system": [
                        {
                            "step": 3.0,
                            "time": 1.0,
                            "gpu1_power_w": 250.0,
                            "gpu1_sm_clock_mhz": 1500.0,
                            "gpu1_energy_j": 1e4,
                            "gpu1_mem_used_bytes": 2e9,
                            "gpu1_temperature_c": 60.0,
                            "cpu_percent": math.nan,
                        }
                    ],
                }
            )
        )
        text = get(sink.url).decode()
    finally:
        sink.close({})
    check = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
    assert _has(
        text,
        "nbmonitor_gpu_power_watts",
        {"gpu": "1", "UUID": "GPU-5678", "Hostname": "node7", "run": context.name, "rank": "0"},
        250.0,
    )
    assert _has(text, "nbmonitor_gpu_sm_clock_hertz", {"gpu": "1"}, 1.5e9)
    assert _has(text, "nbmonitor_gpu_energy_joules_total", {"UUID": "GPU-5678"}, 1e4)
    assert _has(text, "nbmonitor_tokens_total", {"rank": "0"}, 512.0)
    assert _has(text, "nbmonitor_phase_forward_seconds", {}, 0.1)
    assert _has(text, "nbmonitor_samples_per_second", {}, 40.0)
    assert "# TYPE nbmonitor_steps_total counter" in text


def _has(text: str, name: str, labels: dict[str, str], value: float | None = None) -> bool:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return value is None or sample.value == value
    return False


def test_base_unit_names() -> None:
    assert metric_name("step_time") == ("step_time_seconds", 1.0)
    assert metric_name("phase_data_s") == ("phase_data_seconds", 1.0)
    assert metric_name("tokens_per_s") == ("tokens_per_second", 1.0)
    assert metric_name("sm_clock_mhz") == ("sm_clock_hertz", 1e6)
    assert metric_name("power_w") == ("power_watts", 1.0)
    assert metric_name("energy_j") == ("energy_joules", 1.0)
    assert metric_name("temperature_c") == ("temperature_celsius", 1.0)
    assert metric_name("cuda_allocated_bytes") == ("cuda_allocated_bytes", 1.0)
    assert metric_name("val/loss") == ("val_loss", 1.0)
    assert metric_name("cpu_percent") == ("cpu_ratio", 0.01)
    assert metric_name("util_percent") == ("util_ratio", 0.01)


def test_percentages_are_served_as_ratios() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    served = {s.name: s.value for f in text_string_to_metric_families(exposition())
              for s in f.samples}  # fmt: skip
    assert not [name for name in served if name.endswith("_percent")]
    # exposition() gives every system key the value 1 (percent): 0.01 as a ratio.
    assert served["nbmonitor_cpu_ratio"] == served["nbmonitor_gpu_util_ratio"] == 0.01


def test_attaching_again_ten_times_keeps_one_endpoint(tmp_path: pathlib.Path) -> None:
    port = free_port()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitors = []
    for _ in range(10):  # the same cell run again: attach() replaces the earlier monitor
        mon = nbmonitor.attach(
            model, opt, run_dir=tmp_path / "runs", display=False, interval=0.2,
            export=[nbmonitor.export.Prometheus(port=port)],
        )  # fmt: skip
        monitors.append(mon)
        train(mon, model, opt, 3)
        mon.flush()
        assert endpoints() == [("127.0.0.1", port)]
        assert mon.errors == []
        text = get(f"http://127.0.0.1:{port}/metrics").decode()
        assert _has(text, "nbmonitor_steps_total", {"run": mon.name}), text[:400]
        assert text.count("# TYPE nbmonitor_steps_total counter") == 1
    assert [m.status for m in monitors[:-1]] == ["closed"] * 9
    monitors[-1].close()
    assert endpoints() == []
    with socket.socket() as s:  # the port is free again: nothing listens on it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do (TIME_WAIT)
        s.bind(("127.0.0.1", port))
        s.listen()


def exposition(ranks: int = 1) -> str:
    """The exposition of a run with every CPU, GPU and step key nbmonitor writes."""
    from nbmonitor.backends._nvml_queries import GPU_FIELDS
    from nbmonitor.backends.cpu import CPU_KEYS
    from nbmonitor.backends.cuda import ALLOCATOR_KEYS

    steps = {"step": 2.0, "time": 1.0, "loss": 1.0, "lr": 0.1, "grad_norm": 1.0, "samples": 8.0}
    steps.update(step_time=0.1, samples_per_s=80.0, tokens=64.0, tokens_per_s=640.0)
    phases = ("data", "forward", "backward", "optimizer", "other")
    steps.update({f"phase_{p}_s": 0.01 for p in phases})
    system = {"step": 2.0, "time": 1.0, **dict.fromkeys(CPU_KEYS, 1.0)}
    system.update({f"gpu0_{f}": 1.0 for f in GPU_FIELDS})
    system.update(dict.fromkeys(ALLOCATOR_KEYS, 1.0))
    sink = Prometheus(port=0).open(ExportContext("run", None, {"host": "h"}))
    try:
        sink.write(Batch({"steps": [steps], "system": [system]}))
        return get(sink.url).decode()
    finally:
        sink.close({})


def test_the_grafana_dashboard_asks_for_series_the_exporter_serves() -> None:
    import re

    from prometheus_client.parser import text_string_to_metric_families

    served = {s.name for f in text_string_to_metric_families(exposition()) for s in f.samples}
    board = json.loads(
        (pathlib.Path(__file__).parents[2] / "docs" / "grafana-dashboard.json").read_text()
    )
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    asked = {n for e in exprs for n in re.findall(r"nbmonitor_[a-z_]+", e)}
    assert asked and asked <= served, asked - served


def test_rank_zero_serves_every_rank_of_a_job(tmp_path: pathlib.Path) -> None:
    from nbmonitor.sinks import RunLogSink

    logs = [
        RunLogSink.create(tmp_path, "ddp", {"rank": r, "host": f"node{r}"}, job_id="j", rank=r,
                          world_size=2)
        for r in (0, 1)
    ]  # fmt: skip
    logs[1].write(Batch({"steps": [{"step": 7.0, "time": 1.0, "loss": 0.25}]}))
    logs[1].flush()
    context = ExportContext(f"{logs[0].path.parent.name}/rank0", logs[0].path, logs[0].meta, rank=0,
                            world_size=2)  # fmt: skip
    sink = Prometheus(port=0).open(context)
    try:
        sink.write(Batch({"steps": [{"step": 9.0, "time": 1.0, "loss": 0.5}]}))
        sink.flush()  # reads the other ranks' new rows
        text = get(sink.url).decode()
    finally:
        sink.close({})
        for log in logs:
            log.close({"status": "closed"})
    run = logs[0].path.parent.name
    assert _has(text, "nbmonitor_loss", {"run": run, "rank": "0", "host": "node0"}, 0.5)
    assert _has(text, "nbmonitor_loss", {"run": run, "rank": "1", "host": "node1"}, 0.25)
    assert _has(text, "nbmonitor_steps_total", {"rank": "1"}, 7.0)
