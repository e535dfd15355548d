"""Monitor and attach(): the composition root of a live run.

attach() validates, closes any earlier monitor of the same model or of an earlier run of the
same notebook cell, builds the parts (capture on the training thread; pipeline, sinks and views
on the sampler thread), creates the run directory and starts the sampler. Everything after that
happens on the sampler thread, except ``log()``, which only records; the read API reads what
the sampler published. A monitor closes itself once its model is collected (lifetime.py).
"""

from __future__ import annotations

import dataclasses
import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np
import numpy.typing as npt
import torch

import nbmonitor.backends.selection as _backends
from nbmonitor._capture import frameworks
from nbmonitor._capture.capture import build_capture
from nbmonitor._capture.dist import RankInfo, rank_info
from nbmonitor._capture.heap import settle_heap
from nbmonitor._capture.probes.spans import Span, SpanTimer, check_span_name
from nbmonitor._capture.steer import Steering, check_request
from nbmonitor._engine import published as _published
from nbmonitor._engine.derive.memory_table import allocator_text
from nbmonitor._engine.frame import Frame, RunInfo, View
from nbmonitor._engine.published import history
from nbmonitor.errors import ErrorLog, Guard
from nbmonitor.health import Alert, Health
from nbmonitor.health.explain import Explanation, explain
from nbmonitor.health.finetune import AdapterVerdict
from nbmonitor.live import job_steering as _job_steering
from nbmonitor.live import ranks as _ranks
from nbmonitor.live import registry as _registry
from nbmonitor.live.adapters import find_adapters
from nbmonitor.live.build import build_sampler
from nbmonitor.live.lifetime import Lifetime, StepCount
from nbmonitor.live.memory_history import MemoryHistory
from nbmonitor.live.parts import layer_stats, run_meta
from nbmonitor.live.run_memory import RunMemory
from nbmonitor.live.setup_check import check_setup
from nbmonitor.live.steering import build_steering, install_handler, on_stop
from nbmonitor.options import (
    DEFAULT_LAYER_EVERY,
    AttachOptions,
    Options,
    WrappedOptimizer,
    check_model,
)
from nbmonitor.sinks import Sink

if TYPE_CHECKING:
    from nbmonitor._capture.clock import StepClock
    from nbmonitor._capture.recorder import Recorder
    from nbmonitor._engine.pipeline import Pipeline
    from nbmonitor.live.profile import Profile
    from nbmonitor.memory import Freed, OomReport
    from nbmonitor.sinks.base import FanOut
    from nbmonitor.sinks.runlog import RunLogSink

# How long close() waits for a sampler tick in progress (a hung source) before it gives up on
# the last interval rather than hang the notebook.
CLOSE_WAIT_S = 5.0
# How long flush() and frame() wait for the sampler (a hung source cannot hold them longer).
FLUSH_TIMEOUT_S = 5.0


class Monitor:
    """A live monitor of one model's training. Create it with :func:`nbmonitor.attach`.

    The training thread only records; a background thread (``nbmonitor-sampler``) samples the
    system, assembles per-step rows, writes the run log and refreshes the views. ``clock`` (the
    wall clock, seconds since the epoch) and ``timer`` (the host clock that times steps, phases
    and spans) can be replaced, e.g. in tests.

    ``Monitor(model, optimizer, **options)`` builds a monitor without starting it
    (``start()`` installs the hooks and starts the sampler); ``attach`` does both and replaces
    an earlier monitor of the same model. Also a context manager:
    ``with nbmonitor.attach(model, opt) as mon: ...`` closes on exit.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | WrappedOptimizer | None = None,
        *,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
        **options: Unpack[AttachOptions],
    ) -> None:
        # Read from the optimizer as given: a framework's wrapper says how it accumulates.
        accumulation = frameworks.accumulation(model, optimizer)
        optimizer = check_model(model, optimizer)
        opts = Options.from_kwargs(options)
        self.options = opts
        self.interval = float(opts.interval)
        self.total_steps = opts.total_steps
        self.errors_log = ErrorLog()
        errors_log = self.errors_log
        self._clock = clock
        self._start = clock()
        self._dashboard: Any = None
        # One rank of a distributed job (torchrun), or None; read locally, never gathered.
        self.rank: RankInfo | None = rank_info()
        _ranks.check_display_rank(self.rank, opts.display_rank)

        self.backend = _backends.select(model, opts.backend)
        # Built first: memory_history=True off CUDA raises here, before anything starts.
        history = MemoryHistory(self.backend.name) if opts.memory_history else None
        capture = build_capture(
            model,
            optimizer,
            self.errors_log,
            layer_every=opts.layer_every,
            # The memory and structure probes keep their period when layer_every=0 (off).
            memory_every=opts.layer_every or DEFAULT_LAYER_EVERY,
            activations=opts.activations,
            check_forward=opts.check_forward,
            on_nan=opts.on_nan,
            flops=opts.flops,
            start_step=opts.start_step,
            phases=opts.phases,
            clock=timer,
            wall_clock=clock,
            accumulation=accumulation,
        )
        # Held until start(); then the model's hooks hold the step clock and this only weakly.
        self._capture: Any = capture
        self._recorder = capture.recorder
        count = self._count = StepCount(capture.clock)
        self._spans = SpanTimer(
            capture.clock.ctx, Guard("probe:spans", errors_log), count, timer, clock
        )
        layers = layer_stats(capture.params, capture.param_names, optimizer, opts.layer_group)
        layers.module_kinds = {n: type(m).__name__ for n, m in model.named_modules() if n}
        # The adapters of a fine-tune (LoRA, peft's methods, a small trainable part); a model
        # nbmonitor cannot read so is monitored without them.
        try:
            adapters = layers.adapters = find_adapters(model, optimizer)
        except Exception as exc:
            adapters = None
            errors_log.add("adapters", exc)
        run_name = opts.name or type(model).__name__
        meta = run_meta(model, optimizer, opts, self.backend, self._start)
        # The tracked parameters, so that a replay's layer table says what each layer is.
        meta["params"] = [dataclasses.asdict(p) for p in layers.params]
        device_every = capture.clock.phases.device_every  # (timed on the device: the panel)
        meta["phases"] = {"device_every": device_every}
        if adapters is not None:
            meta["adapters"] = adapters.to_json()
        first = next(iter(model.parameters()), None)
        device = str(first.device) if first is not None else "cpu"
        self._runlog, self.name = _ranks.create_runlog(
            opts, run_name, meta, self.rank, device, self.backend.device_index
        )
        self._steering, steer_port = build_steering(
            capture.clock,
            model,
            errors_log,
            self._runlog.path,
            scheduler=opts.scheduler,
            on_checkpoint=opts.on_checkpoint,
            control=True,
            job=_job_steering.job_reader(
                self.rank, self._runlog.path.parent, count.step, errors_log
            ),
        )
        cuda = self.backend.device_index is not None
        life = self._life = build_sampler(
            info=RunInfo(
                self.name,
                self.backend.name,
                self.total_steps,
                len(self.backend.devices),
                allocator_text(meta["allocator"]) if cuda else "",
                device_every,
            ),
            backend=self.backend,
            capture=capture,
            count=count,
            layers=layers,
            health=Health(opts.thresholds),
            forward_checked=opts.check_forward,
            # The run log first, then the exporters (each behind its own guard).
            sinks=[self._runlog, *self._open_exports(meta)],
            errors=errors_log,
            ranks=_ranks.rank_follower(self.rank, self.displays, self._runlog.path),
            job=self.rank is not None,
            clock=clock,
            interval=self.interval,
            steer=steer_port,
        )
        self._session = life.session
        self._pipeline = life.session.pipeline
        if self.rank is not None:  # a request made on this rank goes to the whole job
            pipeline = self._pipeline
            self._steering.route = _job_steering.JobRoute(
                self._runlog.path.parent,
                self.rank.rank,
                self.interval,
                count.step,
                lambda: _published.history(pipeline.model.steps, pipeline.published),
            )
        # A model collected (dropped by the user) closes its run; see lifetime.py.
        self._model_ref = weakref.ref(model, life.release_soon)
        self._pipeline.add_alerts(
            check_setup(model, optimizer, step=opts.start_step, time=self._start, adapters=adapters)
        )
        self._memory = RunMemory(
            probe=capture.memory,
            model=model,
            run=self._pipeline.model,
            history=history,
            errors=errors_log,
            step=life.step,
            optimizer=lambda: getattr(life.clock(), "optimizer", None),
            run_dir=self.run_dir,
            backend=self.backend.name,
            device_index=self.backend.device_index,
        )
        self._finalizer = weakref.finalize(self, life.release_soon)
        self._finalizer.atexit = False  # at exit registry._close_all closes it
        self._setup_views(opts.display)

    # -- construction helpers --------------------------------------------------------------

    def _open_exports(self, meta: dict[str, object]) -> list[Sink]:
        """The exporters' sinks, opened here on the attaching thread (W&B's and MLflow's
        current run are per thread); one that cannot start is one line in ``errors``. In a
        job, the tools with one run for the job (W&B, MLflow, trackio, Prometheus, which
        serves every rank) export from the display rank only; files, from every rank."""
        exps = self.options.export
        if not exps:
            return []
        from nbmonitor._engine.pipeline import SINK_RETRY_S
        from nbmonitor.export import PER_RANK, open_sinks
        from nbmonitor.sinks.exporter import ExportContext

        if not self.displays:
            exps = tuple(e for e in exps if e.name in PER_RANK)
        context = ExportContext(
            name=self.name,
            run_dir=self._runlog.path,
            meta=meta,
            rank=self.rank.rank if self.rank is not None else None,
            world_size=self.rank.world_size if self.rank is not None else 1,
            live=True,
            uuids=gpu_uuids(self.backend.name),
        )
        return open_sinks(exps, context, self.errors_log, retry_after=SINK_RETRY_S)

    def _setup_views(self, display: bool) -> None:
        from nbmonitor.ui.console import ConsoleView, console_logger
        from nbmonitor.ui.notebook import in_notebook

        if not self.displays:
            return  # another rank of the job shows it; this one records silently
        if not display:
            return  # nothing shown or printed, not even through a logging handler set up
        if in_notebook():
            self._session.add_view(self._make_dashboard())
        else:
            # In a script the console line is the view.
            logger = console_logger(install_handler=True)
            # An exporter that did not start is said now, one line each: the closing summary
            # shows only the latest error, and a script has no dashboard to show the rest.
            for entry in self.errors_log.entries():
                if entry.source.startswith("export:"):
                    why = entry.message.removeprefix("ExportError: ").removeprefix("nbmonitor: ")
                    target = entry.source.removeprefix("export:")
                    logger.warning("export to %s did not start: %s", target, why)
            self._session.add_view(ConsoleView(logger))

    def _make_dashboard(self) -> Any:
        from nbmonitor.live.steer_link import DashboardSteering
        from nbmonitor.ui.dashboard import Dashboard

        if self._dashboard is None:
            # Its buttons steer this run; their messages reach a cell busy running the loop.
            link = DashboardSteering(self._steering)
            self._dashboard = Dashboard(
                self.name, self.backend.name, self.total_steps, steer=link.hooks
            )
            link.route(self._dashboard.widget)
        return self._dashboard

    def start(self) -> None:
        """Install the hooks, start the sampler and show the dashboard (attach() does this)."""
        # Before the first monitored step: what the probes allocate each step would otherwise
        # often tip glibc into trimming the heap, and faulting it back, every step (heap.py).
        settle_heap()
        try:
            self._capture.clock.install()
            self._capture = None  # from now on the model holds it (see registry.LIVE)
            self._session.start()
        except BaseException:
            # Nothing of a monitor that did not start stays in the user's model or torch.
            self.close()
            raise
        _registry.started(self)
        self._steering.on_stop = on_stop(self)
        install_handler()
        self._memory.start(watch=self.displays)
        clock = self._life.clock()
        if self._dashboard is not None and self._dashboard.route == "main" and clock is not None:
            # Colab renders only main-thread sends: the loop sends the newest frame at a step end,
            # and a paused loop from where it waits.
            clock.step_listeners.append(self._dashboard.pump)
            self._steering.pump = self._dashboard.pump
        if self.options.display and self._dashboard is not None:
            from nbmonitor.ui.notebook import show

            try:
                show(self._dashboard)
            except Exception as exc:  # a front end that cannot display must not stop training
                self.errors_log.add("view", exc)

    def stop_signal(self) -> None:
        """Ask the sampler to stop without waiting (interpreter exit)."""
        self._session.thread.signal()

    # -- public API ----------------------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        """This run's directory on disk (in a distributed job: this rank's, ``rank<r>/``)."""
        return self._runlog.path

    @property
    def job_dir(self) -> Path | None:
        """In a distributed job, the folder all its ranks write in (``nbmonitor.open`` it for
        the cross-rank view); None for a single-process run."""
        return self._runlog.path.parent if self.rank is not None else None

    @property
    def displays(self) -> bool:
        """Whether this process shows the views: always, but in a distributed job only on
        ``display_rank``."""
        return self.rank is None or self.rank.rank == self.options.display_rank

    @property
    def status(self) -> str:
        """``"running"``, ``"degraded"`` (something failed; see ``errors``), ``"closed"`` or
        ``"stopped"`` (closed by a stop: ``stop()``, the dashboard, ``nbmonitor ctl``); while a
        source hangs, which and for how long: ``"degraded: run log writing hung for
        12 s"``."""
        return self._life.status()

    @property
    def errors(self) -> list[str]:
        """What failed inside nbmonitor, newest last, as ``"HH:MM:SS source: Error: message"``."""
        return [str(e) for e in self.errors_log.entries()]

    @property
    def step(self) -> int:
        """Optimizer steps completed (backward passes when attached without an optimizer),
        counted from ``start_step``."""
        return self._life.step()

    # -- reads: what the sampler published at its last tick, never waiting for it (a hung
    # source cannot hold these up), except frame(), which waits at most FLUSH_TIMEOUT_S ----------

    def history(self) -> dict[str, npt.NDArray[np.float64]]:
        """Per-step columns (step, time, loss, lr, grad_norm, step_time, samples_per_s, ...).

        As of the sampler's last tick (call ``flush()`` first for every step up to now); never
        waits on the sampler. Long runs keep recent steps at full resolution and older ones as
        bucket means; the run log on disk keeps every step.

        ``grad_norm`` is the norm before clipping (what ``torch.nn.utils.clip_grad_norm_``
        returned when the loop clips); then ``grad_clip_coef`` is the factor it scaled the
        gradients by (1 if none). ``step_skipped`` is 1 on steps a ``GradScaler`` skipped,
        which have no gradient norms. ``phase_<name>_s`` are the step's phases (the
        ``phases`` option). Throughput (docs/throughput.md): ``tokens`` and ``tokens_per_s``
        when the model is given token ids (an integer ``input_ids`` keyword, or a 2-D integer
        tensor as the first argument; padding included) and, once the FLOPs are counted,
        ``flops_per_step``, ``tflops_per_s`` and ``mfu_percent`` (NaN where the device's peak
        is not known; ``mon.frame().notes["mfu"]`` says why).
        """
        pipeline = self._pipeline
        return history(pipeline.model.steps, pipeline.published)

    def system(self) -> dict[str, npt.NDArray[np.float64]]:
        """System samples (time, step, cpu_percent, ram_used_bytes, ...), one row per tick."""
        return self._pipeline.model.system.history()

    def events(self) -> list[Alert]:
        """Alerts raised so far, oldest first (as of the sampler's last tick):
        ``nbmonitor.health.Alert`` objects, the type ``nbmonitor.open(path).events()`` returns."""
        return list(self._pipeline.published.alerts)

    def explain(self, which: Alert | int | str | None = None) -> Explanation:
        """What an alert says, as data: its cause, evidence, place and fix, the symptoms it
        took in, or the cause that took it in. ``which``: an alert of ``events()``, an index
        into them (``-1``: the newest), a rule name (its newest alert), or None (the newest
        alert). ``LookupError`` when there is no such alert. A run read back from disk
        (``nbmonitor.open(run_dir).explain``) explains it the same way."""
        return explain(self.events(), which, "mon.explain")

    def adapters(self) -> AdapterVerdict | None:
        """Is this fine-tune training? For a model with adapters (LoRA by hand or with peft,
        IA3, prompts, or a small trainable part on a frozen base), the verdict as of the last
        health check (``flush()`` first for the newest): ``.state`` (``"learning"``,
        ``"not learning"``, ``"not trained"``, ``"too slow"``, ``"receiving gradients"`` (their
        updates not measured: ``layer_every=0``), ``"waiting"``), ``.text`` (one
        line, e.g. ``adapters learning: 24 LoRA matrices, B left zero in 12 of 12 (median norm
        0.031), A moved 0.02 (relative), grads non-zero (median 0.4)``) and the figures it is
        made of. None for a model trained whole."""
        return self._pipeline.published.adapters

    def layers(self, as_dataframe: bool = False) -> Any:
        """One row per layer: name, shape, numel, dtype, device, requires_grad, in_optimizer,
        latest grad_norm, param_norm, update_ratio and flags (the alert rules that named it).

        As of the last health check or flush (call ``flush()`` first for the newest). Returns
        a list of dicts, or a pandas DataFrame with ``as_dataframe=True``.
        """
        table = self._pipeline.published.layer_table
        rows = table.rows() if table is not None else []
        if as_dataframe:
            try:
                import pandas as pd
            except ImportError as exc:
                raise ImportError(
                    "nbmonitor: layers(as_dataframe=True) needs pandas; pip install pandas."
                ) from exc
            return pd.DataFrame(rows)
        return rows

    def figure(self, *keys: str, log: bool = False) -> Any:
        """A bqplot Figure of these metrics against the step, to compose in your own layout:
        ``mon.figure("loss", "grad_norm")``. The series are the dashboard's (decimated to about
        2,000 points); the figure is a snapshot, made again to refresh it."""
        from nbmonitor.ui.figures import metrics_figure

        return metrics_figure(self.frame().series, keys, log=log)

    def frame(self, detail: bool = True) -> Frame:
        """The snapshot the views show now (see ``nbmonitor._engine.frame.Frame``).

        Built between two sampler ticks: it waits for a tick in progress at most
        ``FLUSH_TIMEOUT_S`` and then raises ``TimeoutError`` (a source is hung) rather than
        hang the caller.
        """
        return self._session.frame(detail, FLUSH_TIMEOUT_S)

    def log(self, **scalars: object) -> None:
        """Record values for the current step: numbers or 0-d/1-element tensors on any device.

        Never waits on the device. Logged after ``optimizer.step()``, a value belongs to the step
        that just ended; logged after a forward pass but before the step, to the step in
        progress. Several values for a key in one step are averaged; a ``loss`` logged here is
        the step's loss, not averaged with the model output's ``.loss`` nor the loss read from
        what ``backward()`` started from (one loss per step). NaN and Inf are kept.

        Raised at the call (a bug in the call, not in training): ``TypeError`` for a value of
        the wrong kind (a string, a tensor of several values, a complex one) or a key
        nbmonitor measures itself (``step``, ``time``, ``step_time``, ``samples``,
        ``samples_per_s``, ``grad_norm``, ``lr``, ``lr_group<i>``, ``loss_smooth``, the
        throughput columns, ...); ``ValueError`` for a value of the right kind that cannot be
        read as a number (a meta tensor, an int beyond float range, a failing ``__float__``)
        or a name that cannot be a column (empty, or over 200 characters). A device tensor is
        read later on the sampler thread; one that fails to read there is dropped alone and
        reported in ``errors`` as ``log:<key>``.

        >>> mon.log(loss=loss, accuracy=acc)  # doctest: +SKIP
        """
        count = self._count  # the hot path: one object, as few calls as before the re-cut
        clock = count.clock()
        if count.closed or clock is None:
            return
        clock.log(scalars)  # TypeError for a non-numeric value: a user bug

    # -- memory and OOM: ``mon.memory`` (run_memory.py); the three methods after it are thin
    # delegations to it, kept as they were ---------------------------------------------------

    @property
    def memory(self) -> RunMemory:
        """This run's memory and its out-of-memory errors (``nbmonitor.live.run_memory.RunMemory``).

        Called, what holds memory now: ``mon.memory()`` returns a ``MemoryBreakdown``
        (parameters, buffers, gradients and optimizer state by category, top-level module and
        dtype, exact, from the tensors, and the activations saved for backward on the newest
        sampled step; see ``nbmonitor.memory``). Its members: ``mon.memory.free_oom()``,
        ``mon.memory.snapshot(path)``, ``mon.memory.oom_report(exc)``, ``mon.memory.recording``.

        >>> mon.memory()  # doctest: +SKIP
        """
        return self._memory

    def free_oom(self) -> Freed:
        """After an out-of-memory error in a notebook: drop what the stored error still holds
        (``sys.last_traceback`` and friends, IPython's last result and output history, the
        error's frames), collect, empty the allocator's cache, and say how much came back, so
        that the next cell runs without restarting the kernel. The same as
        ``mon.memory.free_oom()``. See docs/memory.md."""
        return self._memory.free_oom()

    def memory_snapshot(self, path: str | Path) -> Path:
        """With ``attach(..., memory_history=True)`` on CUDA: write the allocator's history
        (segments, and the recent allocations with their stacks) to ``path``, a pickle that
        https://pytorch.org/memory_viz opens. RuntimeError without the history on. The same as
        ``mon.memory.snapshot(path)``."""
        return self._memory.snapshot(path)

    def oom_report(self, exc: BaseException) -> OomReport:
        """The report the card under a cell shows, for an out-of-memory error caught in a
        script: what was being allocated and where, what held memory, what to change
        (``nbmonitor.memory.OomReport``). ValueError for an error that is not one. The same as
        ``mon.memory.oom_report(exc)``.

        >>> try: step()  # doctest: +SKIP
        ... except torch.OutOfMemoryError as exc: report = mon.oom_report(exc)
        """
        return self._memory.oom_report(exc)

    def span(self, name: str) -> Span:
        """A named span of time: ``with mon.span("data"): ...`` or ``@mon.span("eval")``.

        Reusable; nested spans nest (per thread). Each records its name, the step in progress
        (steps completed + 1), its start and its duration on the host clock (a few
        microseconds, never a device sync: GPU work it queued may still run after it exits)
        to spans.jsonl, the timeline panel and ``export_trace``. A name that is not a
        non-empty str raises ``TypeError``; after ``close()`` spans record nothing.
        """
        return Span(check_span_name(name), self._spans)

    def export_trace(self, path: str | Path) -> Path:
        """Write this run's steps, phases and spans (every rank) as a Chrome/Perfetto trace
        JSON file at ``path`` (open it in https://ui.perfetto.dev); flushes first."""
        from nbmonitor.runs.trace import write_trace

        self.flush()
        return write_trace(self.run_dir, path)

    def batch_started(self, batch: object) -> None:
        """For framework adapters: a training micro-batch starts; it counts (samples: the first
        tensor's leading dimension) whatever the training step calls, and values logged from now
        belong to the step in progress. From then on the model's forwards count no batches."""
        count = self._count
        clock = count.clock()
        if not count.closed and clock is not None:
            clock.batch_started(batch)

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Have the sampler take, check and write everything recorded so far, now.

        The one synchronous call: it waits at most ``timeout`` seconds (a hung source cannot
        hold it longer) and returns whether the flush finished. Reads (``history()``,
        ``layers()``, ``events()``) then show every step up to now.
        """
        if self._life.closed:
            return True
        clock = self._life.clock()
        if clock is not None:
            clock.release_losses()  # the last step's, kept while the loop might log its own
        return self._session.flush(timeout)

    def profile(self, steps: int = 3, wait: int = 1, warmup: int = 1) -> Profile:
        """Run ``torch.profiler`` over the next steps and show its table (``nbmonitor.Profile``).

        From the next step boundary it waits ``wait`` steps, warms up ``warmup`` steps and
        records ``steps`` steps (CPU activity, and CUDA on CUDA), then shows ``key_averages``
        in the cell (sortable by CPU time, device time and memory; a log line in a script) and
        saves the Chrome trace and the text table under ``<run_dir>/profiles/``. Never on
        unless called. One at a time: ``RuntimeError`` while one runs, or while another torch
        profiler records; bad arguments raise ``ValueError``; ``close()`` stops one still
        running.

        >>> prof = mon.profile(steps=3)  # doctest: +SKIP
        """
        from nbmonitor.live.profile import start_profile
        from nbmonitor.ui.notebook import in_notebook

        return start_profile(
            self._life,
            self.errors_log,
            self.run_dir,
            cuda=self.backend.name == "cuda",
            notebook=self.options.display and in_notebook(),
            steps=steps,
            wait=wait,
            warmup=warmup,
        )

    # -- steering (docs/steering.md): each asks for the next step boundary, returns at once --

    @property
    def steering(self) -> Steering:
        """This run's steering: ``paused``, ``stop_requested``, ``last_step`` (the step the
        last request was applied at) and ``pending`` (requests waiting for a step's end),
        readable from any thread; ``request(kind, value=None, source=..., at_step=None)`` for
        integrations."""
        return self._steering

    def pause(self) -> None:
        """Pause training at the end of the next step: the loop waits inside
        ``optimizer.step()`` (the update done) until ``resume()`` or ``stop()``, while the
        dashboard stays live. From another thread, the dashboard or ``nbmonitor ctl``."""
        self._steering.request("pause")

    def resume(self) -> None:
        """Resume a paused run."""
        self._steering.request("resume")

    def stop(self) -> None:
        """Stop training at the end of the next step: the run closes with status ``stopped``
        and ``optimizer.step()`` raises ``nbmonitor.StopTraining`` after the update, which ends
        a notebook cell with one line (no traceback) and a script with exit status 0 (a
        ``StopTrainingExit``, a ``SystemExit``). With a framework's callback the framework's
        own stop flag is set instead."""
        self._steering.request("stop")

    def checkpoint(self, path: str | os.PathLike[str] | None = None) -> None:
        """Save a checkpoint at the end of the next step: ``{"model", "optimizer",
        "scheduler" (when attached with one), "step"}`` state dicts with ``torch.save``,
        atomically, to ``path`` (default ``<run_dir>/checkpoints/step-<N>.pt``); resume with
        ``attach(..., start_step=ckpt["step"])``. With ``attach(..., on_checkpoint=fn)``,
        ``fn(path, step)`` is called instead. TypeError for a path that is not a str or
        os.PathLike."""
        why = check_request("checkpoint", path)
        if why is not None:
            raise TypeError(f"nbmonitor: {why}.")
        self._steering.request("checkpoint", os.fspath(path) if path is not None else None)

    def set_lr(self, value: float) -> None:
        """Set the learning rate of every param group to ``value`` at the end of the next step
        (a scheduler given to ``attach(..., scheduler=)`` has its ``base_lrs`` scaled by the
        same factor, so its schedule goes on from there); recorded as a steering event and
        drawn on the lr chart. ValueError for a value that is not a finite number >= 0."""
        why = check_request("lr", value)
        if why is not None:
            raise ValueError(f"nbmonitor: set_lr: {why}.")
        self._steering.request("lr", value)

    def close(self) -> None:
        """Stop monitoring: remove hooks, stop the thread, flush the run log, show the final state.

        Idempotent. Never raises, and never waits more than a few seconds on a hung source
        (what it could not take then is reported in ``errors``).
        """
        self._finalizer.detach()
        closing = not self._life.closed
        if self._steering.stop_requested:
            self._life.stopped = True
        self._steering.release()  # a paused loop goes on; the scheduler is let go
        self._memory.close()
        self._life.close(CLOSE_WAIT_S)
        if self._dashboard is not None:
            self._dashboard.pump()  # the final frame, where it waits for the main thread
        _registry.closed(self._model_ref(), self)
        if closing and self.rank is not None and self.displays:  # the cross-rank summary
            _ranks.finish_job(self.job_dir, self.errors_log, self.options.display, CLOSE_WAIT_S)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def internals(self) -> Internals:
        """The parts this monitor is made of (``nbmonitor.live.monitor.Internals``: the
        pipeline, the run log's sink, the recorder, the step clock), for tests and tools that
        look inside a live run. Not a stable API: what it holds follows the implementation."""
        return Internals(self._pipeline, self._runlog, self._recorder, self._life)

    @property
    def views(self) -> tuple[View, ...]:
        """What shows this monitor's frames (the dashboard, the console line, added views)."""
        return self._session.views

    def add_view(self, view: View) -> None:
        """Show this monitor's frames in ``view`` too: anything with ``publish(frame)``,
        ``close(frame)`` and ``wants_detail``, called from the sampler thread (see
        ``nbmonitor.ui.view.View``)."""
        self._session.add_view(view)

    def dashboard(self) -> Any:
        """The notebook dashboard of this monitor (created on first call); display it anywhere.

        Every view of it shows the same live feed.
        """
        dashboard = self._make_dashboard()
        self.add_view(dashboard)
        return dashboard

    def _display_(self) -> Any:
        """What marimo shows for this object: the dashboard's anywidget (marimo renders
        anywidgets, not the ipywidgets view in ``_repr_mimebundle_``)."""
        return self.dashboard()._display_()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.dashboard()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return (
            f"<nbmonitor.Monitor {self.name!r} backend={self.backend.name!r} step={self.step} "
            f"status={self.status!r}>"
        )


class Internals:
    """``mon.internals``: the parts of a live monitor. For tests and tools that look inside;
    not a stable API."""

    def __init__(
        self, pipeline: Pipeline, runlog: RunLogSink, recorder: Recorder, life: Lifetime
    ) -> None:
        self.pipeline = pipeline
        """The sampler side: the run model, the health check, the sinks, the views."""
        self.runlog = runlog
        """This run's run log sink (its folder's files)."""
        self.recorder = recorder
        """Where the training thread puts its records for the sampler to drain."""
        self._life = life

    @property
    def sinks(self) -> FanOut:
        """What the pipeline writes to: the run log first, then the exporters."""
        return self.pipeline.parts.sinks

    @property
    def closed(self) -> bool:
        """Whether the run has closed (or begun to)."""
        return self._life.closed

    def clock(self) -> StepClock | None:
        """The step clock the model's hooks hold (None once the model is collected or the run
        closed)."""
        return self._life.clock()


def gpu_uuids(backend: str) -> list[str]:
    """The visible GPUs' UUIDs as NVML and DCGM spell them (``GPU-...``), by torch index."""
    if backend != "cuda":
        return []
    from nbmonitor.backends._nvml import nvml_uuid

    try:
        return [
            nvml_uuid(str(torch.cuda.get_device_properties(i).uuid))[0]
            for i in range(torch.cuda.device_count())
        ]
    except Exception:  # an old torch without .uuid: the label stays empty
        return []


def attach(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | WrappedOptimizer | None = None,
    **options: Unpack[AttachOptions],
) -> Monitor:
    """Start monitoring ``model`` (and ``optimizer``) and show the live view.

    Args:
        model: the ``torch.nn.Module`` being trained.
        optimizer: the optimizer whose ``step()`` ends a training step. Without one, the
            first optimizer that steps the model's parameters is adopted (torch's global
            optimizer step hook, removed at close), and its first step includes the backward
            passes before it (gradient accumulation included); until one steps, a backward
            pass whose gradients are reset before the next forward is a step. A framework's
            wrapper with the torch optimizer as ``.optimizer`` (Accelerate's
            ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``) is unwrapped;
            anything else raises ``TypeError``.
        **options: see ``nbmonitor.options.AttachOptions`` (listed below).

    In a notebook the dashboard shows under the cell; in a script a status line prints every
    few seconds. Attaching again to the same model, or from another run of the same notebook
    cell, closes the earlier monitor first; a bad argument raises at the call, in one line,
    and leaves the earlier one running. A failure inside ``attach`` leaves no hook behind. A
    monitor closes itself once its model is garbage-collected. Also a context manager:
    ``with nbmonitor.attach(model, opt) as mon: ...`` closes on exit.

    >>> mon = nbmonitor.attach(model, optimizer, total_steps=500)  # doctest: +SKIP
    """
    # Build (and so validate) the new monitor before closing the old one: a bad argument in a
    # re-run cell must not stop the monitor that is still working.
    monitor = Monitor(model, optimizer, **options)
    _registry.replace(model, monitor)
    monitor.start()
    return monitor


if attach.__doc__ is not None and AttachOptions.__doc__ is not None:
    attach.__doc__ += "\n    Options:\n" + AttachOptions.__doc__.split("\n", 1)[1]
