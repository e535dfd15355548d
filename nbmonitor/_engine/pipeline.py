"""What the sampler does for one live run, tick by tick: sample, collect, check, persist,
publish. The only writer of the stores, the sinks and the views.

The main thread reads only what a tick published (``published``): the stores (behind their
own locks), the alerts, the open rows and the layer table. It never runs a stage itself, so a
hung source can hold up a tick but never ``history()``; ``Monitor.flush()`` asks the sampler
for a full tick and waits for it at most its timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from nbmonitor._engine.assemble.layer_flow import LayerFlow
from nbmonitor._engine.assemble.layers import LayerStats
from nbmonitor._engine.assemble.param_groups import groups_added_notes
from nbmonitor._engine.assemble.spans import span_rows
from nbmonitor._engine.assemble.steps import StepAssembler, StepRows
from nbmonitor._engine.column_cap import ColumnCap
from nbmonitor._engine.frame import Frame, FrameState, View
from nbmonitor._engine.frame_builder import FrameBuilder
from nbmonitor._engine.handover import HandOver
from nbmonitor._engine.isolated import Hung, Sources
from nbmonitor._engine.pipeline_parts import PipelineParts, Training, device_name
from nbmonitor._engine.published import Published
from nbmonitor._engine.run_model import RunModel
from nbmonitor._engine.sampler import Stage
from nbmonitor.health import non_finite_gradients
from nbmonitor.health.alert import BACKEND, Alert
from nbmonitor.health.view import RankColumns
from nbmonitor.records import MemoryRecord

# About the most of one core that the health rules and the view may take on scheduled ticks
# (see Stage): the rules cost ~1 ms for 50 layers and a dashboard frame 2-20 ms, which at
# every 0.5 s tick would be 0.2 % and up to 4 % of a core, and while they hold the GIL the
# training thread waits. Paced, the dashboard refreshes about every 1-1.5 s (at most 2 s apart).
HEALTH_SHARE = 0.001
VIEW_SHARE = 0.0025
# Views are refreshed at most this often, whatever the sampling interval.
PUBLISH_EVERY_S = 0.25
# The health rules see the steps since their last run plus HEALTH_WINDOW before them, at most
# HEALTH_WINDOW_MAX in all.
HEALTH_WINDOW = 512
HEALTH_WINDOW_MAX = 8192
# A scheduled health check judges slices for about this long and leaves the rest to the next
# tick's (Health.check): while the rules run, the training thread waits for the GIL.
HEALTH_BUDGET_S = 0.001
# The most a health check waits for the other ranks' steps (read from their files).
RANKS_TIMEOUT_S = 1.0
# A sink that failed repeatedly (a full disk) is tried again after this many seconds.
SINK_RETRY_S = 30.0
# How long a flush (and the final tick) waits for the exporters behind their queues to hand
# on the rows it gave them: less than the run log worker's hang timeout, which it runs under.
SETTLE_S = 1.0


def no_training(model: RunModel | None) -> Training:
    """The training parts of a session with no training loop: no records, no layers."""
    layers = model.layers if model is not None and model.layers is not None else LayerStats([])
    return Training(drain=lambda wait: [], layers=layers, forward_checked=False)


class Pipeline:
    """One session's tick (``session.Session`` builds it, drives it and closes it).
    ``status`` is the session's, for the frames."""

    def __init__(self, parts: PipelineParts, status: Callable[[], str]) -> None:
        self.parts = parts
        self.status = status
        training = parts.training or no_training(parts.model)
        self.training = training
        # Everything known about the run; frames, rules and sinks read only this.
        model = parts.model or RunModel(training.layers, parts.backend.device_index)
        self.model = model
        model.total_steps = parts.info.total_steps
        self.frames = FrameBuilder(parts.info, self.model)
        self.lock = threading.RLock()
        self.views: tuple[View, ...] = ()
        self.published = Published()
        self._assembler = StepAssembler(device=lambda: device_name(parts.backend))
        # The records stage works in slices and every stage is followed by a hand-over, so
        # that the training thread never waits long for the GIL (handover.py).
        self.hand_over = HandOver()  # .on: in a scheduled tick, which nobody waits for
        self._columns = ColumnCap()
        self.flow = LayerFlow(
            training.layers,
            self.add_alerts,
            non_finite_gradients,
            forward_checked=training.forward_checked,
            clock=parts.clock,
            loop_watched=lambda: self.model.structure.seen("backward"),
        )
        # The sinks get what the model took since the last tick (persist): its outbox.
        model.outbox.open()
        self._dropping = False  # rows are being dropped from the outbox (said once a spell)
        self._notes_seen = 0
        self._copy_skip_reported = False
        self._layer_row_step = -math.inf
        self._layer_grad_keys: tuple[str, ...] | None = None
        self._last_publish = -math.inf
        self._start = time.monotonic()
        errors = parts.errors
        clock = time.monotonic
        # Backend, sinks and views are called through workers: one that hangs holds up itself.
        self.sources = Sources(errors, parts.interval, clock)
        view_worker = self.sources.view

        def view_cpu() -> float:  # the view stage's cost is on its worker too
            return time.thread_time() + view_worker.cpu_used

        self.stages = (
            Stage("sample", self.sample, errors, clock=clock),
            Stage("records", self.collect, errors, clock=clock),
            health := Stage("health", self.check_health, errors, share=HEALTH_SHARE, clock=clock),
            Stage("runlog", self.persist, errors, clock=clock, retry_after=SINK_RETRY_S),
            Stage(
                "view",
                self.publish,
                errors,
                share=VIEW_SHARE,
                max_gap=2.0,
                clock=clock,
                cpu_clock=view_cpu,
            ),
        )
        self._health_stage = health

    # -- a tick ------------------------------------------------------------------------------

    def tick(self, paced: bool) -> None:
        # Overflow in a statistic of non-finite training values is expected (they are
        # reported as alerts); numpy must not print a RuntimeWarning into the user's cell.
        hand_over = self.hand_over
        with (
            self.lock,
            np.errstate(all="ignore"),
            hand_over.scheduled() if paced else contextlib.nullcontext(),
        ):
            behind = self.parts.health.behind  # it left slices to judge: not paced until done
            model, clock = self.model, self.parts.clock
            model.busy_since = clock()
            try:
                for stage in self.stages:
                    stage(paced and not (behind and stage is self._health_stage))
                    hand_over()
            finally:
                model.busy.append((model.busy_since, clock()))
                model.busy_since = math.nan

    def final_tick(self) -> None:
        """Everything recorded, taken and written (close): waits for device values."""
        with self.lock, np.errstate(all="ignore"):
            self.collect(wait=True, everything=True)
            # Unpaced, behind the health stage's own guard: a rule switched off stays off.
            self._health_stage()
            steer = self.training.steer
            if steer is not None:  # a stop's own event, applied as the run closed
                self.add_alerts(steer.take())
            self.persist(final=True)

    # -- stages ------------------------------------------------------------------------------

    def sample(self) -> None:
        parts = self.parts
        notes = parts.backend.notes
        if len(notes) > self._notes_seen:
            # Backend notes (NVML missing, a GPU lost) are facts to show, not failures.
            new, self._notes_seen = notes[self._notes_seen :], len(notes)
            now, step = parts.clock(), parts.current_step()
            self.add_alerts(
                Alert("backend", "info", str(n), step, now, subject=BACKEND) for n in new
            )
        if self.training.steer is not None:
            # The worker may still read the control directory (the last tick's steering poll):
            # the sample waits for it, but not past the moment that call counts as hung.
            self.sources.sample.wait_idle()
        sampled = self.sources.sample.call(parts.backend.sample)
        sample = (
            dict.fromkeys(parts.backend.keys, math.nan) if isinstance(sampled, Hung) else sampled
        )
        row = {"time": parts.clock(), "step": float(parts.current_step()), **sample}
        # What nbmonitor's own stores hold: the leak rule does not count it as the user's.
        row["monitor_bytes"] = float(self.model.steps.nbytes + self.model.system.nbytes)
        current_phase = self.training.current_phase
        if current_phase is not None:
            phase = current_phase()
            row["phase"] = math.nan if phase is None else float(phase)
        self.model.add_system_rows([row])
        steer = self.training.steer
        if steer is not None:  # after the sampling call: the worker is free for the poll
            self.add_alerts(steer.take())
            self.sources.sample.submit(steer.poll)

    def collect(self, wait: bool = False, everything: bool = False, ended: bool = False) -> None:
        """Drain the records (``wait``: for device values too) and store the rows that are
        final (``StepAssembler.take``: ``ended`` for a flush, ``everything`` at close)."""
        assembler, hand_over = self._assembler, self.hand_over
        # In slices of records, in their order: a tick of a fast loop brings thousands.
        for records in assembler.feed(self.training.drain(wait)):
            spans = span_rows(records)
            if spans:
                self.model.add_span_rows(spans)
            memory = [r.breakdown for r in records if isinstance(r, MemoryRecord)]
            if memory:
                self.model.add_memory(memory)
            hand_over()
        added = assembler.take_groups_added()
        if added:
            self.add_alerts(groups_added_notes(added))
        for part in assembler.take(everything=everything, ended=ended):
            # The rows are stored before anything else here can fail: they have left the
            # assembler and exist nowhere else.
            # The store keeps the capped keys; the sinks get every key logged.
            self.model.add_step_rows(*self._cap_columns(part), logged=part.rows)
            hand_over()
        self._report_failures(assembler.take_failures())  # take() adds late values' too
        for step, kind, facts in assembler.take_structure():
            self.model.structure.add(step, kind, facts)
        blocks, aux = assembler.take_layer_blocks()
        step = self.parts.current_step()
        open_rows = tuple(self._columns.filter(assembler.peek_open()))
        self._publish_state(step, open_rows=open_rows)
        hand_over()
        self.flow.add(blocks, aux, step)
        self._report_copy_skip(step)
        self.model.add_layer_rows(self.flow.take_rows())

    def _cap_columns(
        self, part: StepRows
    ) -> tuple[Sequence[dict[str, float]], Mapping[str, Sequence[float]] | None]:
        cap, rows = self._columns, part.rows
        had_refused = cap.first_refused is not None
        if part.columns is None:
            kept, columns = cap.filter(rows), None
        else:
            kept, columns = cap.filter_columns(rows, part.columns)
        if not had_refused and cap.first_refused is not None:
            message = (
                f"More than {cap.limit} distinct keys were logged: {cap.first_refused!r} and "
                "later new keys are kept on disk only, not in history() or the dashboard "
                "(nbmonitor.open(mon.run_dir).history() has every key)."
            )
            step = part.last_step
            self.add_alerts([Alert("columns_capped", "info", message, step, self.parts.clock())])
        return kept, columns

    def _report_failures(self, failures: list[tuple[str, Exception]]) -> None:
        # Once per source per tick: a value that cannot be read every step is one error per
        # tick, not hundreds pushing every other error out of the log.
        seen: set[str] = set()
        for source, exc in failures:
            if source not in seen:
                seen.add(source)
                self.parts.errors.add(source, exc)

    def _report_copy_skip(self, step: int) -> None:
        limit = self.training.update_copy_skipped()
        if limit is None or self._copy_skip_reported:
            return
        self._copy_skip_reported = True
        message = (
            "Update ratios are not measured: copying the trainable parameters across "
            f"optimizer.step() would take more than {limit / 2**30:.3g} GiB. Gradient norms "
            "are still measured every step."
        )
        self.add_alerts([Alert("update_ratio_skipped", "info", message, step, self.parts.clock())])

    def check_health(self) -> None:
        self.flow.take_waiting()
        parts = self.parts
        step = parts.current_step()
        # Paced, the rules may run seconds apart: they get every step since the last one they
        # judged.
        judged = parts.health.judged_step
        since = int(judged) if judged is not None and 0 <= judged <= step else 0
        window = min(HEALTH_WINDOW + step - since, HEALTH_WINDOW_MAX)
        # What the optimizer is (recorded once by the training side), for the time rules.
        self.model.optimizer = self._assembler.optimizer
        inp = self.model.health_input(step, parts.clock(), window, self._ranks())
        self.model.watch_adapters(inp, parts.health.thresholds.update_ratio_low)
        if not self.hand_over.on:  # a flush or the final tick: every step judged
            found = parts.health.check(inp)
        else:
            # Far enough behind that steps would leave the window before they are judged: the
            # check judges them at fewer points (a loop of thousands of steps a second).
            thin = (HEALTH_WINDOW_MAX - HEALTH_WINDOW) // 2
            found = parts.health.check(
                inp,
                final=False,
                budget_s=HEALTH_BUDGET_S,
                thin_beyond=thin,
                between=self.hand_over,
            )
        self.add_alerts(found, judged=True)
        self._publish_layers()
        self._write_layer_grads()

    def _ranks(self) -> RankColumns | None:
        ranks = self.training.ranks
        if ranks is None:
            return None
        # After the rows the last tick handed to the same worker (not waited for there).
        got = self.sources.runlog.call(ranks, timeout=RANKS_TIMEOUT_S, wait_if_busy=True)
        return None if isinstance(got, Hung) else got

    def _write_layer_grads(self) -> None:
        """One run-log row of per-layer gradient norms (the largest of each layer since the last
        such row), so that a replay draws the layer heatmap the live dashboard drew. Written
        at the health checks' pace: every step of every layer would be most of the log."""
        layers = self.training.layers
        got = layers.peak_since(self._layer_row_step)
        if got is None:
            return
        last, peak = got
        self._layer_row_step = last
        if self._layer_grad_keys is None:  # the layers' names are fixed: their keys once
            self._layer_grad_keys = tuple(f"grad_norm/{name}" for name in layers.names)
        row: dict[str, float] = {"step": last}
        row.update(zip(self._layer_grad_keys, peak.tolist(), strict=True))
        self.model.add_layer_rows([row])

    def persist(self, final: bool = False) -> None:
        """Hand the rows the model took since the last time (``RunModel.take_batch``) to the
        run log's worker. A scheduled tick does not wait for the writing (it would only wait
        for the worker's Python to get the GIL); ``flush`` and the final tick wait, for an
        earlier write too, so the rows are on disk when they return. While the worker hangs
        the rows wait in the model's outbox (bounded: the oldest dropped, and said); at the
        final tick they are left to it, written once it answers."""
        writer = self.sources.runlog
        scheduled = self.hand_over.on
        if not scheduled:
            writer.wait_idle()
        busy = writer.busy
        if busy and not final:
            writer.note_hang()
            self._report_dropped(took=False)
            return
        batch = self.model.take_batch()
        self._report_dropped(took=True, final=final)
        sinks = self.parts.sinks

        def write_and_flush() -> None:
            sinks.write(batch)  # every sink behind its own guard (FanOut)
            sinks.flush()
            if not scheduled:  # flush(): the exporters' queues too, unless one hangs
                sinks.settle(SETTLE_S)

        if busy:  # final: after the call in progress
            writer.defer(write_and_flush)
        elif scheduled:
            if not writer.submit(write_and_flush):  # closed meanwhile: written after the rest
                writer.defer(write_and_flush)
        else:  # HUNG: the worker holds the rows and writes them when the file system answers
            writer.call(write_and_flush)

    def _report_dropped(self, took: bool, final: bool = False) -> None:
        """Say once a spell that rows are dropped while the sinks do not take them, and at
        the final tick how many were in all."""
        outbox, errors = self.model.outbox, self.parts.errors
        new = outbox.take_dropped()
        if new and not self._dropping:
            what = ", ".join(f"{n} {stream}" for stream, n in new.items())
            errors.add(
                "runlog",
                OverflowError(
                    f"{what} rows dropped: the sinks did not take them (the run log hung) and "
                    f"at most {outbox.limit} rows per stream wait for them; older ones are "
                    "dropped until they do (the count in all is said at close)"
                ),
            )
            self._dropping = True
        if took:  # the spell is over: the next one is said again
            self._dropping = False
        if final and outbox.dropped:
            what = ", ".join(f"{n} {stream}" for stream, n in outbox.dropped.items())
            message = f"{what} rows dropped in all: the sinks did not take them in time"
            errors.add("runlog", OverflowError(message))

    def publish(self) -> None:
        now = time.monotonic()
        if not self.views or now - self._last_publish < PUBLISH_EVERY_S:
            return
        self._last_publish = now
        views = self.views
        if self.sources.view.hung_for() is not None:
            return
        frame = self.frame(detail=any(v.wants_detail for v in views))

        def publish_all() -> None:
            for view in views:
                view.publish(frame)

        self.sources.view.call(publish_all)

    # -- alerts and published state ------------------------------------------------------------

    def add_alerts(self, alerts: Iterable[Alert], judged: bool = False) -> None:
        """Keep, write and publish ``alerts``. Those not ``judged`` by the health rules (the
        engine's, the static checks') are told to them, for a cause to take in."""
        added = self.model.add_alerts(alerts)
        if not judged and added:
            self.parts.health.note(added)
        if added:
            self.published = dataclasses.replace(self.published, alerts=self.model.alerts)

    def _publish_state(self, step: int, open_rows: tuple[dict[str, float], ...]) -> None:
        self.published = dataclasses.replace(self.published, open_rows=open_rows, step=step)

    def _publish_layers(self) -> None:
        # A snapshot, made into rows by the reader (mon.layers(), on its own thread).
        table = self.model.layer_table()
        verdict = self.model.adapter_verdict
        self.published = dataclasses.replace(self.published, layer_table=table, adapters=verdict)

    def refresh_layers(self) -> None:
        """Take the waiting per-layer norms and publish the layer table (flush, close)."""
        with self.lock:
            self.flow.take_waiting()
            self._publish_layers()

    # -- frames ------------------------------------------------------------------------------

    def _notes(self) -> dict[str, str]:
        flops = self._assembler.flops
        return {"mfu": flops.note} if flops is not None and flops.note else {}

    def frame(self, detail: bool = True) -> Frame:
        """A snapshot of everything the views show (on the sampler, or under ``lock``); with
        ``detail`` it takes the per-layer norms waiting for a reader."""
        parts, model = self.parts, self.model
        if detail:
            self.flow.take_waiting()
        state = FrameState(
            status=self.status(),
            step=parts.current_step(),
            elapsed_s=time.monotonic() - self._start,
            open_rows=self.published.open_rows,
            errors=[str(e) for e in parts.errors.entries()],
            devices=tuple(parts.backend.device_gauges(dict(model.last_sample))),
            notes=self._notes(),
        )
        return self.frames.build(state, detail=detail, hand_over=self.hand_over)
