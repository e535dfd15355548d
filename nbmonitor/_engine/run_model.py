"""The run model: everything known about one run, the one thing frames, rules and sinks read.

A live run fills it from the records the sampler drains (``pipeline.py``); a run on disk fills
it from its files, whole or record by record as another process writes them (``run_state.py``).
Both put the same rows in the same places, and everything derived from them (best loss, energy
per step and per sample, the clipping share, the health rules' input) is computed here once,
so a live run, a replayed one and a tailed one cannot drift apart. numpy only.

It is also the sinks' only ledger: every row it takes goes into its ``outbox``
(``outbox.py``), once its reader opened it, and the sampler hands the sinks what
``take_batch()`` gives: a row reaches the run log and the exporters because the model took
it, not because a caller also listed it somewhere else.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from nbmonitor._engine.assemble.layers import LayerStats, LayerTable
from nbmonitor._engine.assemble.spans import SpanLog
from nbmonitor._engine.derive.clipping import clip_share
from nbmonitor._engine.derive.energy import energy_rates
from nbmonitor._engine.derive.headroom import headroom
from nbmonitor._engine.outbox import Outbox
from nbmonitor._engine.store import FloatArray, Store
from nbmonitor.health import HealthInput
from nbmonitor.health.alert import Alert
from nbmonitor.health.finetune import AdapterVerdict, AdapterWatch
from nbmonitor.health.structure import StructureLog
from nbmonitor.health.view import RankColumns
from nbmonitor.memory import MemoryBreakdown
from nbmonitor.records import PHASE_KEYS, OptimizerRecord
from nbmonitor.runs.column_rows import ColumnRows
from nbmonitor.sinks import Batch

# The alerts a run keeps (the frame shows the newest few; the run log keeps every one).
MAX_ALERTS = 200
# The step columns the health rules read.
HEALTH_COLUMNS = ("step", "time", "loss", "grad_norm", "lr", "grad_clip_coef", "step_skipped")
# The system samples the health rules see.
HEALTH_SYSTEM_ROWS = 120
# The sampler's busy spells kept for the time rules: more than the ticks over the steps they
# judge (RECENT_STEPS and the look-back of health/rules/time.py).
BUSY_KEPT = 64
# The per-layer columns of the run log's layers stream: the largest gradient norm of each
# layer since the previous row, and the newest parameter norm and update ratio.
GRAD_PREFIX = "grad_norm/"
PARAM_PREFIX = "param_norm/"
RATIO_PREFIX = "update_ratio/"


class RunModel:
    """One run's stores (steps, system), spans and phases, layers, alerts and the figures
    derived from them.

    ``layers`` is known from the start of a live run (its parameters); a run on disk gets it
    from its first per-layer rows (``set_layers``). ``device_index`` is the accelerator the
    model trains on (None on the CPU): its energy counter gives the energy figures.
    """

    def __init__(
        self,
        layers: LayerStats | None = None,
        device_index: int | None = None,
        *,
        system: Store | None = None,
    ) -> None:
        self.steps = Store()
        # A watch of the machine that may stay open for days passes a store sized for it.
        self.system = system if system is not None else Store()
        self.spans = SpanLog()
        self.layers = layers
        self.device_index = device_index
        # What a live run's optimizer is (records.OptimizerRecord), for the time rules; None
        # when not known (a run on disk).
        self.optimizer: OptimizerRecord | None = None
        # The planned number of steps, when the run said (the schedule rule reads it).
        self.total_steps: int | None = None
        # The sampler's own busy spells (``Pipeline.tick``), newest last, and the start of the
        # one running now (NaN: none): ``HealthInput.monitor_busy``.
        self.busy: deque[tuple[float, float]] = deque(maxlen=BUSY_KEPT)
        self.busy_since = math.nan
        # What the training side read of the run's structure (health/structure.py).
        self.structure = StructureLog()
        self._alerts: list[Alert] = []
        self._layer_flags: dict[str, list[str]] = {}
        self._best_loss = math.nan
        self._last_sample: dict[str, float] = {}
        self._first_time = math.nan
        self._last_time = math.nan
        # The newest memory breakdown (nbmonitor.memory), from a probe or memory.jsonl.
        self.memory: MemoryBreakdown | None = None
        # Is the fine-tune training: the adapters' running account and its newest verdict.
        self._adapter_watch: AdapterWatch | None = None
        self.adapter_verdict: AdapterVerdict | None = None
        # What it took since its reader's last take_batch(): the sinks' rows (outbox.py).
        self.outbox = Outbox()

    # -- input: the same for a live run and a run on disk ---------------------------------------

    def add_step_rows(
        self,
        rows: Sequence[Mapping[str, float]],
        columns: Mapping[str, Sequence[float]] | None = None,
        *,
        logged: Sequence[Mapping[str, float]] | None = None,
    ) -> None:
        """Rows of consecutive steps; ``columns``, the same rows as columns when the caller
        has them (a run of alike steps: every row has every key, NaN where one lacks it),
        spare a pass per key over the rows. ``logged``: the rows as they were logged when
        ``rows`` keep only some of their keys (the live store's column cap): the sinks get
        every key. Rows held as columns (``ColumnRows``) reach the sinks as they are: no dict
        is made per row here."""
        self.outbox.put("steps", rows if logged is None else logged)
        if not rows:
            return
        if columns is not None:
            arrays = {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}
            self.steps.extend_columns(arrays)
            self.spans.add_steps(rows, arrays)
            self._note_steps(arrays.get("loss"), arrays.get("time"))
            return
        self.steps.extend(rows)
        self.spans.add_steps(rows)
        self._note_steps(
            np.array([r.get("loss", math.nan) for r in rows], dtype=np.float64),
            np.array([r.get("time", math.nan) for r in rows], dtype=np.float64),
        )

    def add_step_columns(self, columns: Mapping[str, FloatArray]) -> None:
        """A whole steps stream read at once (a run opened from disk): columns, not rows."""
        if not columns or not len(next(iter(columns.values()))):
            return
        if self.outbox.is_open:
            self.outbox.put("steps", _rows_of(columns))
        self.steps.extend_columns(columns)
        self.spans.add_step_columns(columns)
        self._note_steps(columns.get("loss"), columns.get("time"))

    def add_system_rows(self, rows: Sequence[Mapping[str, float]]) -> None:
        if rows:
            self.outbox.put("system", rows)
            self.system.extend(rows)
            self._last_sample = dict(rows[-1])

    def add_system_columns(self, columns: Mapping[str, FloatArray]) -> None:
        if columns and len(next(iter(columns.values()))):
            if self.outbox.is_open:
                self.outbox.put("system", _rows_of(columns))
            self.system.extend_columns(columns)
            self._last_sample = {k: float(v[-1]) for k, v in columns.items()}

    def add_span_rows(self, rows: Sequence[Mapping[str, object]]) -> None:
        """Span rows (``assemble/spans.py``), as the spans stream keeps them."""
        if rows:
            self.outbox.put("spans", rows)
            self.spans.add_spans(rows)

    def add_alerts(self, alerts: Iterable[Alert]) -> list[Alert]:
        """Keep ``alerts`` (the newest ``MAX_ALERTS``) and the layers they name; the ones added."""
        added = list(alerts)
        for alert in added:
            for layer in alert.layers:
                # Each rule once per layer: a condition that recurs all run long would
                # otherwise grow the list without bound (the table shows each rule once).
                named = self._layer_flags.setdefault(layer, [])
                if alert.rule not in named:
                    named.append(alert.rule)
        self._alerts += added
        del self._alerts[:-MAX_ALERTS]
        if added and self.outbox.is_open:  # every one: the run log keeps what the model drops
            self.outbox.put("events", [a.to_record() for a in added])
        return added

    def add_memory(self, breakdowns: Sequence[MemoryBreakdown]) -> None:
        """Breakdowns of sampled steps, oldest first: the newest is kept (the sinks get all)."""
        if breakdowns:
            if self.outbox.is_open:
                self.outbox.put("memory", [b.to_record() for b in breakdowns])
            self.memory = breakdowns[-1]

    def set_layers(self, layers: LayerStats) -> None:
        """The layers of a run on disk, once its first per-layer rows name them."""
        if self.layers is None:
            self.layers = layers

    def add_layer_rows(self, rows: Sequence[Mapping[str, float]]) -> None:
        """Per-layer rows of a live run, of values its ``layers`` already took (the layer
        flow fills them record by record, at full resolution): for the sinks only."""
        self.outbox.put("layers", rows)

    def add_layer_columns(
        self,
        columns: Mapping[str, FloatArray],
        new_layers: Callable[[Sequence[str]], LayerStats],
    ) -> None:
        """Per-layer columns as the layers stream keeps them (a run on disk, whole or the
        records just written): ``step`` and ``grad_norm/<layer>`` (the largest gradient norm
        since the previous row), ``param_norm/<layer>``, ``update_ratio/<layer>``.
        ``new_layers`` makes the layer table from the layers the first such columns name
        (a run on disk: from its meta.json); later columns of layers it lacks are left out."""
        if not columns or not len(next(iter(columns.values()))):
            return
        if self.outbox.is_open:
            self.outbox.put("layers", _rows_of(columns))
        names = [k.removeprefix(GRAD_PREFIX) for k in columns if k.startswith(GRAD_PREFIX)]
        names += [
            k.split("/", 1)[1]
            for k in columns
            if k.startswith((PARAM_PREFIX, RATIO_PREFIX)) and k.split("/", 1)[1] not in names
        ]
        if self.layers is None:
            if not names:
                return
            self.layers = new_layers(list(dict.fromkeys(names)))
        layers = self.layers
        steps = columns.get("step")
        if steps is None:
            return
        known = {n: i for i, n in enumerate(layers.names)}
        grads = [
            (known[n], columns[GRAD_PREFIX + n])
            for n in names
            if n in known and GRAD_PREFIX + n in columns
        ]
        if grads:
            rows = ~np.all([np.isnan(v) for _, v in grads], axis=0)
            norms = np.full((int(rows.sum()), len(layers.names)), np.nan)
            for i, values in grads:
                if i < norms.shape[1]:
                    norms[:, i] = values[rows]
            layers.add_grad_norm_rows(steps[rows].astype(int).tolist(), norms, None)
        newest: dict[str, dict[int, float]] = {"param_norm": {}, "update_ratio": {}}
        for prefix, target in ((PARAM_PREFIX, "param_norm"), (RATIO_PREFIX, "update_ratio")):
            for name, i in known.items():
                column = columns.get(prefix + name)
                if column is not None:
                    finite = column[~np.isnan(column)]
                    if finite.size:
                        newest[target][i] = float(finite[-1])
        layers.set_newest(newest["param_norm"], newest["update_ratio"])

    def _note_steps(self, loss: FloatArray | None, times: FloatArray | None) -> None:
        if loss is not None and len(loss):
            finite = loss[np.isfinite(loss)]
            if finite.size:
                low = float(finite.min())
                self._best_loss = low if math.isnan(self._best_loss) else min(self._best_loss, low)
        if times is not None and len(times):
            finite = times[np.isfinite(times)]
            if finite.size:
                if math.isnan(self._first_time):
                    self._first_time = float(finite[0])
                self._last_time = float(finite[-1])

    # -- output --------------------------------------------------------------------------------

    def take_batch(self) -> Batch:
        """Every row taken since the last call, per stream, oldest first: what the sinks get
        (the reader opens ``outbox`` first; see ``outbox.py`` for its bound)."""
        return self.outbox.take()

    @property
    def alerts(self) -> tuple[Alert, ...]:
        return tuple(self._alerts)

    @property
    def layer_flags(self) -> dict[str, list[str]]:
        """Per layer, the rules whose alerts named it (each once, in the order they first did)."""
        return self._layer_flags

    @property
    def last_sample(self) -> Mapping[str, float]:
        """The newest system sample."""
        return self._last_sample

    @property
    def best_loss(self) -> float:
        """The lowest finite loss so far (NaN before one)."""
        return self._best_loss

    @property
    def last_step(self) -> int:
        return int(self.steps.last("step")) if len(self.steps) else 0

    @property
    def steps_span_s(self) -> float:
        """Seconds from the first step's end to the newest's (0 before two steps)."""
        span = self._last_time - self._first_time
        return span if math.isfinite(span) else 0.0

    def derived(self) -> dict[str, float]:
        """The figures derived from the stores that the frame shows beside the newest row:
        best loss, energy per step and per sample, the share of recent steps clipped, the
        memory headroom and the batch that fits."""
        out = {"best_loss": self._best_loss}
        out.update(energy_rates(self.system, self.steps, self.device_index))
        out.update(clip_share(self.steps))
        out.update(headroom(self.system, self.steps, self.memory, self.device_index))
        return out

    def layer_table(self) -> LayerTable | None:
        """The layer table as it is now (None before the layers are known)."""
        return self.layers.snapshot(self._layer_flags) if self.layers is not None else None

    def watch_adapters(self, inp: HealthInput, too_slow: float) -> None:
        """Take what ``inp`` brings of the adapters (a check's input, before its rules)."""
        if inp.adapters is None:
            return
        watch = self._adapter_watch
        if watch is None or watch.adapters is not inp.adapters:
            watch = self._adapter_watch = AdapterWatch(inp.adapters, too_slow)
        watch.observe(inp)
        self.adapter_verdict = watch.verdict()

    def health_input(
        self, step: int, time: float, window: int, ranks: RankColumns | None = None
    ) -> HealthInput:
        """What the health rules read: the last ``window`` steps, the layers, recent system
        samples and, on a job's display rank, every rank's step times."""
        steps = self.steps
        columns = steps.tails((*HEALTH_COLUMNS, "step_time", *PHASE_KEYS), window)
        system = self.system.tails(self.system.columns, HEALTH_SYSTEM_ROWS)
        gpus = [self.device_index] if self.device_index is not None else None
        layers = self.layers
        if layers is None:
            return HealthInput(step=step, time=time, steps=columns, system=system, gpus=gpus,
                               ranks=ranks, optimizer=self.optimizer,
                               total_steps=self.total_steps,
                               structure=self.structure.snapshot(),
                               monitor_busy=self.monitor_busy())  # fmt: skip
        layer_steps, layer_norms = layers.recent()
        update_steps, update_series, param_series = layers.update_history()
        return HealthInput(
            step=step,
            time=time,
            steps=columns,
            layer_names=layers.names,
            layer_steps=layer_steps,
            layer_grad_norms=layer_norms,
            param_norms=layers.param_norm,
            update_ratios=layers.update_ratio,
            update_steps=update_steps,
            update_series=update_series,
            param_series=param_series,
            module_kinds=layers.module_kinds,
            adapters=layers.adapters,
            activations=layers.activations or None,
            system=system,
            gpus=gpus,
            ranks=ranks,
            optimizer=self.optimizer,
            total_steps=self.total_steps,
            structure=self.structure.snapshot(),
            monitor_busy=self.monitor_busy(),
        )

    def monitor_busy(self) -> tuple[tuple[float, float], ...]:
        """The sampler's recent busy spells, the running one last (ending at inf)."""
        spells = tuple(self.busy)
        if not math.isnan(self.busy_since):
            spells += ((self.busy_since, math.inf),)
        return spells


def _rows_of(columns: Mapping[str, FloatArray]) -> ColumnRows:
    """Columns of equal length as rows (NaN where a row lacks a key, as a store reads), held
    as columns: a row is made only for a sink that reads rows."""
    return ColumnRows({k: np.asarray(v, dtype=np.float64).tolist() for k, v in columns.items()})


def floats(row: Mapping[str, Any]) -> dict[str, float]:
    """A record read from disk as a row of floats (None is NaN; other values are left out)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
        elif value is None:
            out[key] = math.nan
    return out


__all__ = [
    "GRAD_PREFIX",
    "MAX_ALERTS",
    "PARAM_PREFIX",
    "RATIO_PREFIX",
    "RunModel",
    "floats",
]
