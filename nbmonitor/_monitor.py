"""Monitor: the lifecycle of one monitored model, and the glue between the parts.

attach() validates, closes any earlier monitor of the same model (the notebook cell re-run),
installs the hooks, creates the run directory and starts the sampler thread. Everything after
that happens in ``tick()`` on the sampler thread, except ``log()``, which only records.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime as _dt
import itertools
import math
import os
import platform
import socket
import statistics
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from nbmonitor import backends as _backends
from nbmonitor._args import check_attach_args, check_layer_args, coerce_thresholds, json_safe
from nbmonitor._frame import Alert, Frame, Series
from nbmonitor._gradnorms import grad_norms, norm_dtype
from nbmonitor._heap import settle_heap
from nbmonitor._hooks import Hooks, optimizer_parameters
from nbmonitor._layers import LayerStats, ParamInfo
from nbmonitor._recorder import AuxRecord, Recorder
from nbmonitor._sampler import ErrorLog, SamplerThread, Source
from nbmonitor._steps import LayerNorms, StepAssembler
from nbmonitor._store import Store
from nbmonitor._version import __version__
from nbmonitor.debug import check_setup, first_non_finite, grads_never_arrived
from nbmonitor.health import Health, HealthInput, Thresholds, non_finite_gradients
from nbmonitor.sinks.runlog import RunLogSink as RunLog
from nbmonitor.ui.base import View

# Chart lines sent to views: bounded so that one publish stays small however long the run.
STEP_SERIES = ("loss", "loss_smooth", "lr", "grad_norm", "step_time", "samples_per_s")
SYSTEM_SERIES = ("cpu_percent", "process_cpu_percent", "ram_used_bytes", "process_rss_bytes")
DEVICE_SERIES = ("util_percent", "mem_used_bytes", "temperature_c", "power_w")
MAX_POINTS = 2000
# Views are refreshed at most this often, whatever the sampling interval.
PUBLISH_EVERY_S = 0.25
# About the most of one core that the health rules and the view may take on scheduled ticks
# (see Source): the rules cost ~1 ms for 50 layers and a dashboard frame 2-20 ms, which at
# every 0.5 s tick would be 0.2 % and up to 4 % of a core, and while they hold the GIL the
# training thread waits. Paced, the dashboard refreshes about every 1-1.5 s (at most 2 s apart).
HEALTH_SHARE = 0.001
VIEW_SHARE = 0.0025
# The health rules see the steps since their last run plus this many before them, at most
# HEALTH_WINDOW_MAX in all.
HEALTH_WINDOW_MAX = 8192
MAX_ALERTS = 200
# Parameter norms and update ratios are measured every this many steps by default: a copy of
# the parameters across optimizer.step() is the costly part (see docs/performance.md).
DEFAULT_LAYER_EVERY = 100
# Steps after which a trainable parameter that never received a gradient is reported.
NO_GRAD_AFTER_STEPS = 10
# Rows of recent history handed to the health rules each tick.
HEALTH_WINDOW = 512
# Finite per-layer gradient norms wait for their readers (the health rules, a detailed frame,
# layers()) and are then taken in one numpy pass, but never more than this many values.
LAYER_DEFER_MAX_VALUES = 2**20

Columns = dict[str, npt.NDArray[np.float64]]

# The live monitor of each model, so that attaching again replaces it.
_LIVE: weakref.WeakKeyDictionary[torch.nn.Module, Monitor] = weakref.WeakKeyDictionary()
_ALL: weakref.WeakSet[Monitor] = weakref.WeakSet()
_atexit_registered = False


def _signal_all() -> None:
    # At interpreter exit only signal: joining threads or writing files here can hang shutdown.
    for monitor in list(_ALL):
        monitor._thread.signal()


def _merge_rows(columns: Columns, rows: Iterable[Mapping[str, float]]) -> Columns:
    """Append rows to equal-length columns, NaN-filling keys a side lacks."""
    rows = list(rows)
    if not rows:
        return columns
    n = len(next(iter(columns.values()))) if columns else 0
    keys = list(columns)
    for row in rows:
        keys.extend(k for k in row if k not in columns and k not in keys)
    out: Columns = {}
    for key in keys:
        old = columns.get(key, np.full(n, np.nan))
        new = np.array([row.get(key, math.nan) for row in rows], dtype=np.float64)
        out[key] = np.concatenate([old, new])
    return out


class Monitor:
    """A live monitor of one model's training. Create it with :func:`nbmonitor.attach`.

    The training thread only records; a background thread (``nbmonitor-sampler``) samples the
    system, assembles per-step rows, writes the run log and refreshes the views.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        interval: float = 0.5,
        total_steps: int | None = None,
        run_dir: str | os.PathLike[str] = "runs",
        name: str | None = None,
        backend: str = "auto",
        display: bool = True,
        layer_every: int = DEFAULT_LAYER_EVERY,
        layer_group: str = "param",
        activations: bool = False,
        check_forward: bool = False,
        on_nan: str = "warn",
        thresholds: Thresholds | Mapping[str, float] | None = None,
    ) -> None:
        check_attach_args(model, optimizer, interval, total_steps, name)
        check_layer_args(layer_every, layer_group, on_nan)
        self._health = Health(coerce_thresholds(thresholds))
        self._model_ref = weakref.ref(model)
        self.interval = float(interval)
        self.total_steps = total_steps
        self.errors_log = ErrorLog()
        self._closed = False
        self._close_lock = threading.Lock()
        self._tick_lock = threading.RLock()
        self._start = time.time()
        self._start_mono = time.monotonic()
        self._last_publish = -math.inf
        self._views: tuple[View, ...] = ()
        self._dashboard: Any = None
        self._alerts: list[Alert] = []
        self._pending_steps: list[dict[str, float]] = []
        self._pending_samples: list[dict[str, float]] = []
        self._pending_events: list[dict[str, object]] = []
        self._pending_layer_rows: list[dict[str, float]] = []
        self._last_sample: dict[str, float] = {}
        self._notes_seen = 0

        self.backend = _backends.select(model, backend)
        self._recorder = Recorder()
        self._hooks = Hooks(
            model,
            optimizer,
            self._recorder,
            self.errors_log.add,
            layer_every=layer_every,
            activations=activations,
            check_forward=check_forward,
            on_nan=on_nan,
        )
        in_opt = {id(p) for p in optimizer_parameters(optimizer)} if optimizer else set()
        self._layers = LayerStats(
            [
                ParamInfo(
                    name=n,
                    shape=tuple(p.shape),
                    numel=p.numel(),
                    dtype=str(p.dtype).removeprefix("torch."),
                    device=str(p.device),
                    requires_grad=p.requires_grad,
                    in_optimizer=id(p) in in_opt,
                )
                for n, p in zip(self._hooks.param_names, self._hooks.params, strict=True)
            ],
            group_by=layer_group,
        )
        if self._hooks.params:
            # Known from the start so that vanishing gradients (grad norm relative to the
            # parameter norm) can be judged before the first update-ratio step. One wait, at
            # attach, never in the loop.
            params = self._hooks.params
            norms = grad_norms([p.detach() for p in params], norm_dtype(params))
            norms.wait()
            self._layers.set_param_norms(norms.values())
        self._layer_flags: dict[str, list[str]] = {}
        self._no_grad_checked = False
        self._nonfinite_reported = False
        self._deferred: list[LayerNorms] = []
        self._deferred_values = 0
        self._copy_skip_reported = False
        self._health_step = 0
        self._steps = Store()
        self._system = Store()
        self._assembler = StepAssembler()
        self._best_loss = math.nan
        run_name = name or type(model).__name__
        self._runlog = RunLog.create(
            run_dir, run_name, self._meta(model, optimizer, run_dir, name, backend, display)
        )
        self.name = self._runlog.path.name
        self._sources = [
            Source("sample", self._sample, self.errors_log),
            Source("records", self._collect, self.errors_log),
            Source("health", self._check_health, self.errors_log, share=HEALTH_SHARE),
            Source("runlog", self._persist, self.errors_log),
            Source("view", self._publish, self.errors_log, share=VIEW_SHARE, max_gap=2.0),
        ]
        self._add_alerts(check_setup(model, optimizer, step=0, time=self._start))
        self._thread = SamplerThread(self._scheduled_tick, self.interval)
        self._setup_views(display)

    # -- construction helpers --------------------------------------------------------------

    def _meta(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        run_dir: str | os.PathLike[str],
        name: str | None,
        backend: str,
        display: bool,
    ) -> dict[str, object]:
        params = list(model.parameters())
        opt_meta: object = None
        if optimizer is not None:
            opt_meta = {
                "class": type(optimizer).__qualname__,
                "param_groups": len(optimizer.param_groups),
                "defaults": json_safe(optimizer.defaults),
            }
        return {
            "model": {
                "class": type(model).__qualname__,
                "module": type(model).__module__,
                "parameters": sum(p.numel() for p in params),
                "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
                "device": _backends.model_device_type(model),
            },
            "optimizer": opt_meta,
            "backend": {"name": self.backend.name, "devices": list(self.backend.devices)},
            "versions": {
                "nbmonitor": __version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
            },
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "start_time": _dt.datetime.fromtimestamp(self._start, _dt.UTC).isoformat(),
            "start_timestamp": self._start,
            "attach": {
                "interval": self.interval,
                "total_steps": self.total_steps,
                "run_dir": str(run_dir),
                "name": name,
                "backend": backend,
                "display": display,
                "layer_every": self._hooks.layer_every,
                "layer_group": self._layers.group_by,
                "activations": self._hooks.activations,
                "check_forward": self._hooks.check_forward,
                "on_nan": self._hooks.on_nan,
            },
        }

    def _setup_views(self, display: bool) -> None:
        from nbmonitor.ui.console import ConsoleView, console_logger
        from nbmonitor.ui.notebook import in_notebook

        if in_notebook():
            if display:
                self._views = (self._make_dashboard(),)
        else:
            # In a script the console line is the view; with display=False it still goes to
            # the "nbmonitor" logger but no handler is installed for it.
            self._views = (ConsoleView(console_logger(install_handler=display)),)

    def _make_dashboard(self) -> Any:
        from nbmonitor.ui.dashboard import Dashboard

        if self._dashboard is None:
            self._dashboard = Dashboard(self.name, self.backend.name, self.total_steps)
        return self._dashboard

    def _start_running(self) -> None:
        global _atexit_registered
        # Before the first monitored step: what the hooks allocate each step would otherwise
        # often tip glibc into trimming the heap, and faulting it back, every step (_heap.py).
        settle_heap()
        self._hooks.install()
        self._thread.start()
        _ALL.add(self)
        if not _atexit_registered:
            atexit.register(_signal_all)
            _atexit_registered = True

    # -- public API ----------------------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        """This run's directory on disk."""
        return self._runlog.path

    @property
    def status(self) -> str:
        """``"running"``, ``"degraded"`` (something failed; see ``errors``) or ``"closed"``."""
        if self._closed:
            return "closed"
        return "degraded" if len(self.errors_log) else "running"

    @property
    def errors(self) -> list[str]:
        """What failed inside nbmonitor, newest last, as ``"HH:MM:SS source: Error: message"``."""
        return [str(e) for e in self.errors_log.entries()]

    @property
    def step(self) -> int:
        """Optimizer steps completed (backward passes when attached without an optimizer)."""
        return self._hooks.step

    def log(self, **scalars: object) -> None:
        """Record values for the current step: numbers or 0-d/1-element tensors on any device.

        Never waits on the device. Logged after ``optimizer.step()``, a value belongs to the step
        that just ended; logged after a forward pass but before the step, to the step in
        progress. Several values for a key in one step are averaged. NaN and Inf are kept.

        >>> mon.log(loss=loss, accuracy=acc)  # doctest: +SKIP
        """
        if self._closed:
            return
        self._hooks.log(scalars)  # raises TypeError for a non-numeric value: that is a user bug

    def close(self) -> None:
        """Stop monitoring: remove hooks, stop the thread, flush the run log, show the final state.

        Idempotent. Never raises; anything that fails is kept in ``errors``.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._hooks.remove()
            self._thread.stop()
            with self._tick_lock:
                self._collect(wait=True, everything=True)
                Source("health", self._check_health, self.errors_log)()
                self._persist()
                frame = self.frame()
                for view in self._views:
                    Source("view", lambda v=view: v.close(frame), self.errors_log)()  # type: ignore[misc]
                self._runlog.update_meta(
                    end_time=_dt.datetime.now(_dt.UTC).isoformat(),
                    steps=self._hooks.step,
                    status="degraded" if len(self.errors_log) else "closed",
                    errors=self.errors,
                )
        except Exception as exc:
            self.errors_log.add("close", exc)
        finally:
            self._runlog.close()
            try:
                self.backend.close()
            except Exception as exc:
                self.errors_log.add("close", exc)
            model = self._model_ref()
            if model is not None and _LIVE.get(model) is self:
                del _LIVE[model]
            _ALL.discard(self)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def history(self) -> dict[str, npt.NDArray[np.float64]]:
        """Per-step columns (step, time, loss, lr, grad_norm, step_time, samples_per_s, ...).

        Takes everything recorded so far first. Long runs keep recent steps at full resolution
        and older ones as bucket means; the run log on disk keeps every step.
        """
        with self._tick_lock:
            if not self._closed:
                self._collect()
            columns = self._steps.history()
            return _merge_rows(columns, self._assembler.peek_open())

    def system(self) -> dict[str, npt.NDArray[np.float64]]:
        """System samples (time, step, cpu_percent, ram_used_bytes, ...), one row per tick."""
        with self._tick_lock:
            return self._system.history()

    def events(self) -> list[Alert]:
        """Alerts raised so far, oldest first."""
        with self._tick_lock:
            return list(self._alerts)

    def dashboard(self) -> Any:
        """The notebook dashboard of this monitor (created on first call); display it anywhere.

        Every view of it shows the same live feed.
        """
        dashboard = self._make_dashboard()
        if dashboard not in self._views:
            self._views = (*self._views, dashboard)
            if self._closed:
                dashboard.close(self.frame())
        return dashboard

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.dashboard()._repr_mimebundle_(**kwargs)
        return bundle

    def __repr__(self) -> str:
        return (
            f"<nbmonitor.Monitor {self.name!r} backend={self.backend.name!r} step={self.step} "
            f"status={self.status!r}>"
        )

    # -- the sampler's work ----------------------------------------------------------------------

    def tick(self) -> None:
        """One sampler iteration, synchronously: sample, collect, check, persist, publish."""
        self._tick(paced=False)

    def _scheduled_tick(self) -> None:
        self._tick(paced=True)

    def _tick(self, paced: bool) -> None:
        with self._tick_lock:
            if self._closed:
                return
            for source in self._sources:
                source(paced)

    def _sample(self) -> None:
        notes = getattr(self.backend, "notes", None)
        if isinstance(notes, list) and len(notes) > self._notes_seen:
            # Backend notes (NVML missing, a GPU lost) are facts to show, not failures.
            new, self._notes_seen = notes[self._notes_seen :], len(notes)
            now, step = time.time(), self._hooks.step
            self._add_alerts(Alert("backend", "info", str(n), step, now) for n in new)
        sample = self.backend.sample()
        row = {"time": time.time(), "step": float(self._hooks.step), **sample}
        self._last_sample = row
        self._system.append(row)
        self._pending_samples.append(row)

    def _collect(self, wait: bool = False, everything: bool = False) -> None:
        self._assembler.add(self._recorder.drain(wait=wait))
        rows = self._assembler.take_final(everything=everything)
        self._collect_layers()
        if rows:
            for row in rows:
                loss = row.get("loss", math.nan)
                if math.isfinite(loss) and not loss >= self._best_loss:
                    self._best_loss = loss
            self._steps.extend(rows)
            self._pending_steps.extend(rows)

    def _collect_layers(self) -> None:
        layers, assembler = self._layers, self._assembler
        blocks, aux = assembler.layer_norms, assembler.aux
        assembler.layer_norms, assembler.aux = [], []
        if not aux and all(block.finite.all() for block in blocks):
            # The usual tick: finite gradients only. They wait for whoever reads the layers
            # next (every few ticks) and are then taken in one numpy pass: per tick that pass
            # was a sixth of the sampler's time, most of it per call, not per step.
            for block in blocks:
                self._defer(block)
        else:
            self._collect_layers_in_order(blocks, aux)
        if self._hooks.update_copy_skipped and not self._copy_skip_reported:
            self._copy_skip_reported = True
            self._add_alerts(
                [
                    Alert(
                        "update_ratio_skipped",
                        "info",
                        "Update ratios are not measured: copying the trainable parameters across "
                        "optimizer.step() would take more than "
                        f"{self._hooks.update_copy_max_bytes / 2**30:.3g} GiB. Gradient norms are "
                        "still measured every step.",
                        self._hooks.step,
                        time.time(),
                    )
                ]
            )
        if not self._no_grad_checked and self._hooks.step >= NO_GRAD_AFTER_STEPS:
            self._no_grad_checked = True
            self._take_deferred()
            trainable = [p.requires_grad for p in layers.params]
            names = [p.name for p, t in zip(layers.params, trainable, strict=True) if t]
            seen = layers.seen[np.asarray(trainable, dtype=bool)]
            alert = grads_never_arrived(names, seen, step=self._hooks.step, time=time.time())
            if alert is not None:
                self._add_alerts([alert])

    def _defer(self, block: LayerNorms) -> None:
        """Let finite gradient norms wait for the next reader of the layers (bounded)."""
        self._deferred.append(block)
        self._deferred_values += block.norms.size
        if self._deferred_values >= LAYER_DEFER_MAX_VALUES:
            self._take_deferred()

    def _take_deferred(self) -> None:
        """Hand the waiting finite gradient norms to the layer statistics, consecutive blocks
        of one index in one pass. Everything that reads the layers, or must come after these
        steps (a non-finite step, forward or update measurements), calls this first."""
        blocks, self._deferred, self._deferred_values = self._deferred, [], 0
        for index, group in itertools.groupby(blocks, key=lambda block: block.index):
            run = list(group)
            self._nonfinite_reported = False
            steps = [step for block in run for step in block.steps]
            norms = run[0].norms if len(run) == 1 else np.concatenate([b.norms for b in run])
            self._layers.add_grad_norm_rows(steps, norms, index)

    def _collect_layers_in_order(
        self, blocks: list[LayerNorms], aux: list[tuple[AuxRecord, list[float]]]
    ) -> None:
        # In step order, and a step's forward measurements before its gradients, so that a
        # non-finite gradient report names the module of its own episode. Finite steps wait
        # as in the usual tick; whatever else comes takes the waiting ones first.
        work: list[tuple[int, int, AuxRecord | LayerNorms, int | list[float]]] = [
            (record.step, 0, record, values) for record, values in aux
        ]
        work += [(step, 1, block, k) for block in blocks for k, step in enumerate(block.steps)]
        for step, _, item, detail in sorted(work, key=lambda w: (w[0], w[1])):
            if isinstance(item, LayerNorms):
                assert isinstance(detail, int)
                if item.finite[detail]:
                    row = slice(detail, detail + 1)
                    self._defer(LayerNorms((step,), item.norms[row], item.index, item.finite[row]))
                    continue
                self._take_deferred()
                self._take_nonfinite_norms(step, item.norms[detail], item.index)
            else:
                assert isinstance(detail, list)
                self._take_deferred()
                self._take_aux(item, detail)

    def _take_aux(self, record: AuxRecord, values: list[float]) -> None:
        layers = self._layers
        if record.kind == "update":
            layers.add_update(values)
            row = {"step": float(record.step)}
            for name, pn, ur in zip(
                layers.names, layers.param_norm, layers.update_ratio, strict=True
            ):
                row[f"param_norm/{name}"] = float(pn)
                row[f"update_ratio/{name}"] = float(ur)
            self._pending_layer_rows.append(row)
        elif record.kind == "forward":
            layers.add_forward(record.step, record.names, values)
        elif record.kind == "activations":
            layers.add_activations(record.names, values)

    def _take_nonfinite_norms(
        self, step: int, norms: npt.NDArray[np.float64], index: tuple[int, ...] | None
    ) -> None:
        layers = self._layers
        # Reported once when gradients turn non-finite, again only after they recovered.
        # Detected here, per step, from the raw norms: which parameters had a gradient is
        # known exactly, so a NaN norm is never confused with "no gradient".
        if not self._nonfinite_reported:
            which = index if index is not None else range(len(norms))
            names = [layers.params[j].name for j in which]
            bad = first_non_finite(names, norms, limit=len(names))
            forward = layers.first_bad_forward
            if forward is not None and forward[0] > step:
                forward = None
            report = non_finite_gradients(
                step, time.time(), bad, forward, self._hooks.check_forward
            )
            self._add_alerts([report])
        self._nonfinite_reported = True
        layers.add_grad_norms(step, norms, index)

    def _check_health(self) -> None:
        self._take_deferred()
        steps = self._steps
        # Paced, the rules may run seconds apart: they get every step since their last run.
        window = min(HEALTH_WINDOW + self._hooks.step - self._health_step, HEALTH_WINDOW_MAX)
        self._health_step = self._hooks.step
        columns: dict[str, npt.NDArray[np.float64]] = {
            key: steps.tail(key, window)
            for key in ("step", "loss", "grad_norm")
            if key in steps.columns
        }
        layer_steps, layer_norms = self._layers.recent()
        system = {key: self._system.tail(key, 120) for key in self._system.columns}
        gpus = getattr(self.backend, "device_index", None)
        inp = HealthInput(
            step=self._hooks.step,
            time=time.time(),
            steps=columns,
            layer_names=self._layers.names,
            layer_steps=layer_steps,
            layer_grad_norms=layer_norms,
            param_norms=self._layers.param_norm,
            update_ratios=self._layers.update_ratio,
            activations=self._layers.activations or None,
            system=system,
            gpus=[gpus] if isinstance(gpus, int) else None,
        )
        self._add_alerts(self._health.check(inp))

    def _add_alerts(self, alerts: Iterable[Alert]) -> None:
        for alert in alerts:
            self._alerts.append(alert)
            del self._alerts[:-MAX_ALERTS]
            self._pending_events.append(dataclasses.asdict(alert))
            for layer in alert.layers:
                self._layer_flags.setdefault(layer, []).append(alert.rule)

    def layers(self, as_dataframe: bool = False) -> Any:
        """One row per layer: name, shape, numel, dtype, device, requires_grad, in_optimizer,
        latest grad_norm, param_norm, update_ratio and flags (the alert rules that named it).

        Returns a list of dicts, or a pandas DataFrame with ``as_dataframe=True``.
        """
        with self._tick_lock:
            if not self._closed:
                self._collect()
            self._take_deferred()
            rows = self._layers.table(self._layer_flags)
        if as_dataframe:
            try:
                import pandas as pd
            except ImportError as exc:
                raise ImportError(
                    "nbmonitor: layers(as_dataframe=True) needs pandas; pip install pandas."
                ) from exc
            return pd.DataFrame(rows)
        return rows

    def _persist(self) -> None:
        steps, samples, events = self._pending_steps, self._pending_samples, self._pending_events
        self._pending_steps, self._pending_samples, self._pending_events = [], [], []
        if steps:
            self._runlog.write_steps(steps)
        if samples:
            self._runlog.write_samples(samples)
        if events:
            self._runlog.write_events(events)
        layer_rows, self._pending_layer_rows = self._pending_layer_rows, []
        if layer_rows:
            self._runlog.write_layers(layer_rows)
        self._runlog.flush()

    def _publish(self) -> None:
        now = time.monotonic()
        if not self._views or now - self._last_publish < PUBLISH_EVERY_S:
            return
        self._last_publish = now
        views = self._views
        frame = self.frame(detail=any(getattr(v, "wants_detail", True) for v in views))
        for view in views:
            view.publish(frame)

    def _energy_rates(self) -> dict[str, float]:
        """Joules per step and per sample on the training GPU over the last ~20 samples."""
        index = getattr(self.backend, "device_index", None)
        key = f"gpu{index}_energy_j"
        if not isinstance(index, int) or key not in self._system.columns:
            return {}
        energy, steps = self._system.tail(key, 20), self._system.tail("step", 20)
        ok = np.isfinite(energy) & np.isfinite(steps)
        if ok.sum() < 2 or steps[ok][-1] <= steps[ok][0]:
            return {}
        per_step = float((energy[ok][-1] - energy[ok][0]) / (steps[ok][-1] - steps[ok][0]))
        out = {"energy_per_step_j": per_step}
        if "samples" in self._steps.columns:
            samples = self._steps.tail("samples", 20)
            samples = samples[np.isfinite(samples) & (samples > 0)]
            if samples.size:
                out["energy_per_sample_j"] = per_step / statistics.median(samples.tolist())
        return out

    def frame(self, detail: bool = True) -> Frame:
        """A snapshot of everything the views show, built on the sampler thread or under the tick
        lock (with ``detail`` it takes the per-layer norms waiting for a reader).

        Without ``detail`` the chart series and the per-layer panel are left out: a console
        line needs neither, and decimating every series is the costly part of a frame.
        """
        latest: dict[str, float] = {k: v for k, v in self._last_sample.items() if k != "step"}
        steps = self._steps
        if len(steps):
            latest.update(steps.last_row())
        for row in self._assembler.peek_open():
            latest.update({k: v for k, v in row.items() if not math.isnan(v) or k not in latest})
        latest["best_loss"] = self._best_loss
        latest.update(self._energy_rates())
        series = {}
        for name in STEP_SERIES if detail else ():
            if name in steps.columns:
                x, y = steps.series(name, MAX_POINTS)
                series[name] = Series(x, y)
        system_names = list(SYSTEM_SERIES) if detail else []
        for i in range(len(self.backend.devices) if detail else 0):
            system_names.extend(f"gpu{i}_{key}" for key in DEVICE_SERIES)
        for name in system_names:
            if name in self._system.columns:
                x, y = self._system.series(name, MAX_POINTS)
                series[name] = Series(x, y)
        step = self._hooks.step
        eta = math.nan
        if self.total_steps and "step_time" in steps.columns:
            recent = steps.tail("step_time", 50)
            recent = recent[np.isfinite(recent)]
            if recent.size:
                # statistics.median: np.median imports numpy.ma on first use (~20 ms).
                eta = max(0, self.total_steps - step) * statistics.median(recent.tolist())
        gauges = getattr(self.backend, "device_gauges", None)
        devices = tuple(gauges(self._last_sample)) if gauges is not None else ()
        if detail and self._layers.names:
            self._take_deferred()
        return Frame(
            run=self.name,
            backend=self.backend.name,
            status=self.status,
            step=step,
            total_steps=self.total_steps,
            elapsed_s=time.monotonic() - self._start_mono,
            eta_s=eta,
            latest=latest,
            series=series,
            devices=devices,
            alerts=tuple(self._alerts[-20:]),
            errors=tuple(self.errors[-5:]),
            layers=(
                self._layers.frame(self._layer_flags) if detail and self._layers.names else None
            ),
        )


def attach(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    interval: float = 0.5,
    total_steps: int | None = None,
    run_dir: str | os.PathLike[str] = "runs",
    name: str | None = None,
    backend: str = "auto",
    display: bool = True,
    layer_every: int = DEFAULT_LAYER_EVERY,
    layer_group: str = "param",
    activations: bool = False,
    check_forward: bool = False,
    on_nan: str = "warn",
    thresholds: Thresholds | Mapping[str, float] | None = None,
) -> Monitor:
    """Start monitoring ``model`` (and ``optimizer``) and show the live view.

    Args:
        model: the ``torch.nn.Module`` being trained.
        optimizer: the optimizer whose ``step()`` ends a training step; without one, each
            backward pass counts as a step.
        interval: seconds between system samples (and run-log flushes).
        total_steps: the planned number of steps, for progress and ETA.
        run_dir: folder under which this run's directory is created.
        name: a name for the run (default: the model's class name).
        backend: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"mps"``.
        display: in a notebook, show the dashboard under the cell; in a script, print a status
            line every few seconds.
        layer_every: measure parameter norms and update ratios (||dw|| / ||w||) every this
            many steps (0: never). Per-layer gradient norms are measured every step.
        layer_group: ``"param"`` (a layer is a parameter) or ``"module"``.
        activations: record activation statistics of leaf modules every ``layer_every``
            steps (mean, std, max |x|, fraction of zeros) and report dead units.
        check_forward: check every module's output for NaN/Inf, to name the first module
            that produced one (costs a few small kernels per module per forward).
        on_nan: ``"warn"`` reports non-finite gradients in the alerts; ``"raise"`` raises
            ``nbmonitor.NonFiniteError`` from ``optimizer.step()`` before the bad update is
            applied (this checks on the host every step, so it synchronises on CUDA).
        thresholds: health-rule thresholds, as ``nbmonitor.Thresholds`` or a dict of its fields.

    Attaching again to the same model closes the earlier monitor first.

    >>> mon = nbmonitor.attach(model, optimizer, total_steps=500)  # doctest: +SKIP
    """
    # Build (and so validate) the new monitor before closing the old one: a bad argument in a
    # re-run cell must not stop the monitor that is still working.
    monitor = Monitor(
        model,
        optimizer,
        interval=interval,
        total_steps=total_steps,
        run_dir=run_dir,
        name=name,
        backend=backend,
        display=display,
        layer_every=layer_every,
        layer_group=layer_group,
        activations=activations,
        check_forward=check_forward,
        on_nan=on_nan,
        thresholds=thresholds,
    )
    previous = _LIVE.get(model)
    if previous is not None:
        previous.close()
    _LIVE[model] = monitor
    monitor._start_running()
    if display and monitor._dashboard is not None:
        from nbmonitor.ui.notebook import show

        try:
            show(monitor._dashboard)
        except Exception as exc:  # a front end that cannot display must not stop training
            monitor.errors_log.add("view", exc)
    return monitor
