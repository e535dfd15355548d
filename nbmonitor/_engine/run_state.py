"""A run read from disk (whole, or record by record as it is written) into the run model a
live run fills (``run_model.RunModel``), so that the one FrameBuilder draws it: the replay's
and the tail's engine state."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from nbmonitor._engine.assemble.layers import LayerStats, ParamInfo
from nbmonitor._engine.assemble.spans import SpanLog
from nbmonitor._engine.derive.memory_table import allocator_text
from nbmonitor._engine.frame import Frame, FrameState, RunInfo
from nbmonitor._engine.frame_builder import FrameBuilder
from nbmonitor._engine.run_model import RunModel, floats
from nbmonitor._engine.store import Store
from nbmonitor.health.adapters import Adapters
from nbmonitor.health.alert import Alert
from nbmonitor.memory import MemoryBreakdown


def run_info(meta: Mapping[str, Any], name: str) -> RunInfo:
    """What meta.json says of the run itself (its backend, planned steps, accelerators)."""
    backend = meta.get("backend") or {}
    devices = backend.get("devices") if isinstance(backend, Mapping) else None
    attach = meta.get("attach") or {}
    total = attach.get("total_steps") if isinstance(attach, Mapping) else None
    cuda = device_index(meta) is not None
    phases = meta.get("phases")
    every = phases.get("device_every") if isinstance(phases, Mapping) else None
    return RunInfo(
        name,
        str(backend.get("name", "?")) if isinstance(backend, Mapping) else "?",
        total if isinstance(total, int) else None,
        len(devices) if isinstance(devices, list) else 0,
        allocator_text(meta.get("allocator")) if cuda else "",
        every if isinstance(every, int) and not isinstance(every, bool) and every > 0 else 0,
    )


def device_index(meta: Mapping[str, Any]) -> int | None:
    """The accelerator the run trained on, as meta.json says (None on the CPU)."""
    backend = meta.get("backend")
    index = backend.get("device_index") if isinstance(backend, Mapping) else None
    if index is None:
        index = meta.get("device_index")  # a rank of a job says it at the top level
    return index if isinstance(index, int) and not isinstance(index, bool) else None


class RunState:
    """What a run on disk has said so far, in the run model the FrameBuilder reads."""

    def __init__(self, meta: Mapping[str, Any], name: str) -> None:
        self.meta = meta
        self.info = run_info(meta, name)
        self.model = RunModel(device_index=device_index(meta))
        self.model.total_steps = self.info.total_steps
        self.builder = FrameBuilder(self.info, self.model)

    @property
    def steps(self) -> Store:
        return self.model.steps

    @property
    def spans(self) -> SpanLog:
        return self.model.spans

    @property
    def alerts(self) -> tuple[Alert, ...]:
        return self.model.alerts

    # -- input ---------------------------------------------------------------------------------

    def add_columns(self, stream: str, columns: Mapping[str, np.ndarray[Any, Any]]) -> None:
        """A whole stream read at once (``open``): columns, not rows."""
        if stream == "steps":
            self.model.add_step_columns(columns)
        elif stream == "system":
            self.model.add_system_columns(columns)
        elif stream == "layers":
            self._add_layer_columns(columns)

    def add_rows(self, streams: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """New records of a run being written (``tail``), per stream."""
        steps = [r for r in streams.get("steps", ()) if isinstance(r.get("step"), (int, float))]
        self.model.add_step_rows([floats(r) for r in steps])
        self.model.add_system_rows([floats(r) for r in streams.get("system", ())])
        self.add_events(streams.get("events", ()))
        self.model.add_span_rows(list(streams.get("spans", ())))
        self.add_memory(streams.get("memory", ()))
        layers = [floats(r) for r in streams.get("layers", ())]
        if layers:
            keys = sorted({k for r in layers for k in r})
            self._add_layer_columns(
                {k: np.array([r.get(k, math.nan) for r in layers], dtype=np.float64) for k in keys}
            )

    def add_memory(self, records: Sequence[Mapping[str, Any]]) -> None:
        """memory.jsonl records: the newest that reads as a breakdown is kept (one that does
        not is skipped here; ``Run.memory()`` reports it)."""
        for record in reversed(records):
            try:
                self.model.add_memory([MemoryBreakdown.from_record(record)])
            except ValueError:
                continue
            return

    def add_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Records of events.jsonl as alerts (typed and bounded: ``Alert.from_record``); a
        record that is not one is skipped (one bad record never costs the others)."""
        alerts = [a for a in map(Alert.from_record, events) if a is not None]
        self.model.add_alerts(alerts)

    def _add_layer_columns(self, columns: Mapping[str, np.ndarray[Any, Any]]) -> None:
        self.model.add_layer_columns(columns, self._new_layers)

    def _new_layers(self, names: Sequence[str]) -> LayerStats:
        """The layer table of the layers the run's first per-layer rows name, from meta.json."""
        stats = LayerStats([self._layer_info(n) for n in names], group_by="param")
        # The adapters meta.json kept (untrusted: malformed reads as none).
        stats.adapters = Adapters.from_json(self.meta.get("adapters"))
        return stats

    def _layer_info(self, layer: str) -> ParamInfo:
        """What meta.json says of the parameters of ``layer`` (a parameter, or a module when
        the run grouped by module), as one row of the layer table."""
        params = self.meta.get("params")
        attach = self.meta.get("attach")
        by_module = isinstance(attach, Mapping) and attach.get("layer_group") == "module"
        members: list[Mapping[str, Any]] = []
        if isinstance(params, list):
            for p in params:
                if not isinstance(p, Mapping):
                    continue
                name = str(p.get("name", ""))
                owner = (name.rsplit(".", 1)[0] if "." in name else "(root)") if by_module else name
                if owner == layer:
                    members.append(p)
        if not members:  # a run written before meta.json listed its parameters
            return ParamInfo(layer, (), 0, "?", "?", True, True)
        # meta.json may come from elsewhere: a field of the wrong type reads as unknown.
        first = members[0]
        shape = first.get("shape") if len(members) == 1 else ()
        counts = [_count(d) for d in shape] if isinstance(shape, list) else []
        dims = tuple(d for d in counts if d is not None)
        return ParamInfo(
            layer,
            dims if len(dims) == len(counts) else (),
            sum(_count(p.get("numel", 0)) or 0 for p in members),
            _text(first.get("dtype")),
            _text(first.get("device")),
            any(_flag(p.get("requires_grad")) for p in members),
            all(_flag(p.get("in_optimizer")) for p in members),
        )

    # -- output --------------------------------------------------------------------------------

    def frame(self, status: str, detail: bool = True) -> Frame:
        model = self.model
        state = FrameState(status=status, step=model.last_step, elapsed_s=model.steps_span_s)
        return self.builder.build(state, detail=detail)


def _count(value: object) -> int | None:
    """A non-negative integer count from meta.json (a shape's dimension, a numel), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if 0 <= value < 2**63 else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else "?"


def _flag(value: object) -> bool:
    return value if isinstance(value, bool) else True
