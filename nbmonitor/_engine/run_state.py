"""A run read from disk (whole, or record by record as it is written) in the stores a live
run fills, so that the one FrameBuilder draws it: the replay's and the tail's engine state."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from nbmonitor._engine.assemble.layers import LayerStats, ParamInfo
from nbmonitor._engine.assemble.spans import SpanLog
from nbmonitor._engine.derive.clipping import clip_share
from nbmonitor._engine.frame import Frame, FrameBuilder, FrameState, RunInfo
from nbmonitor._engine.store import Store
from nbmonitor.health.alert import Alert

GRAD_PREFIX = "grad_norm/"
PARAM_PREFIX = "param_norm/"
RATIO_PREFIX = "update_ratio/"
ALERT_FIELDS = ("rule", "severity", "message", "step", "time", "layers", "subject")


class RunState:
    """What a run on disk has said so far, in the stores the FrameBuilder reads."""

    def __init__(self, meta: Mapping[str, Any], name: str) -> None:
        self.meta = meta
        backend = meta.get("backend") or {}
        devices = backend.get("devices") if isinstance(backend, Mapping) else None
        attach = meta.get("attach") or {}
        total = attach.get("total_steps") if isinstance(attach, Mapping) else None
        self.info = RunInfo(
            name,
            str(backend.get("name", "?")) if isinstance(backend, Mapping) else "?",
            total if isinstance(total, int) else None,
            len(devices) if isinstance(devices, list) else 0,
        )
        self.steps = Store()
        self.system = Store()
        self.builder = FrameBuilder(self.info, self.steps, self.system)
        self.alerts: list[Alert] = []
        self.spans = SpanLog()
        self._flags: dict[str, list[str]] = {}
        self._layers: LayerStats | None = None
        self._best_loss = math.nan
        self._last_sample: dict[str, float] = {}
        self._first_time = math.nan
        self._last_time = math.nan

    # -- input ---------------------------------------------------------------------------------

    def add_columns(self, stream: str, columns: Mapping[str, np.ndarray[Any, Any]]) -> None:
        """A whole stream read at once (``open``): columns, not rows."""
        if not columns or not len(next(iter(columns.values()))):
            return
        if stream == "steps":
            self.steps.extend_columns(columns)
            self.spans.add_step_columns(columns)
            self._note_steps(columns.get("loss"), columns.get("time"))
        elif stream == "system":
            self.system.extend_columns(columns)
            self._last_sample = {k: float(v[-1]) for k, v in columns.items()}
        elif stream == "layers":
            self._add_layer_columns(columns)

    def add_rows(self, streams: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """New records of a run being written (``tail``), per stream."""
        steps = [r for r in streams.get("steps", ()) if isinstance(r.get("step"), (int, float))]
        if steps:
            rows = [_floats(r) for r in steps]
            self.steps.extend(rows)
            self.spans.add_steps(rows)
            self._note_steps(
                np.array([r.get("loss", math.nan) for r in steps], dtype=np.float64),
                np.array([r.get("time", math.nan) for r in steps], dtype=np.float64),
            )
        system = [_floats(r) for r in streams.get("system", ())]
        if system:
            self.system.extend(system)
            self._last_sample = system[-1]
        self.add_events(streams.get("events", ()))
        self.spans.add_spans(streams.get("spans", ()))
        layers = [_floats(r) for r in streams.get("layers", ())]
        if layers:
            keys = sorted({k for r in layers for k in r})
            self._add_layer_columns(
                {k: np.array([r.get(k, math.nan) for r in layers], dtype=np.float64) for k in keys}
            )

    def add_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            try:
                alert = Alert(
                    rule=str(event["rule"]),
                    severity=str(event.get("severity", "info")),
                    message=str(event.get("message", "")),
                    step=int(event.get("step", 0)),
                    time=float(event.get("time", math.nan)),
                    layers=tuple(str(n) for n in event.get("layers", ()) or ()),
                    subject=str(event.get("subject", "run")),  # runs before subjects: "run"
                )
            except (KeyError, TypeError, ValueError):
                continue  # one bad record never costs the others
            self.alerts.append(alert)
            for layer in alert.layers:
                self._flags.setdefault(layer, []).append(alert.rule)

    def _note_steps(self, loss: Any, times: Any) -> None:
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

    def _add_layer_columns(self, columns: Mapping[str, np.ndarray[Any, Any]]) -> None:
        names = [k.removeprefix(GRAD_PREFIX) for k in columns if k.startswith(GRAD_PREFIX)]
        names += [
            k.split("/", 1)[1]
            for k in columns
            if k.startswith((PARAM_PREFIX, RATIO_PREFIX)) and k.split("/", 1)[1] not in names
        ]
        if self._layers is None:
            if not names:
                return
            infos = [self._layer_info(n) for n in dict.fromkeys(names)]
            self._layers = LayerStats(infos, group_by="param")
        layers = self._layers
        known = {n: i for i, n in enumerate(layers.names)}
        steps = columns.get("step")
        if steps is None:
            return
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
        for prefix, target in (
            (PARAM_PREFIX, layers.param_norm),
            (RATIO_PREFIX, layers.update_ratio),
        ):
            for name, i in known.items():
                column = columns.get(prefix + name)
                if column is not None:
                    finite = column[~np.isnan(column)]
                    if finite.size:
                        target[i] = finite[-1]

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
        first = members[0]
        shape = tuple(first.get("shape") or ()) if len(members) == 1 else ()
        return ParamInfo(
            layer,
            tuple(int(d) for d in shape),
            sum(int(p.get("numel", 0)) for p in members),
            str(first.get("dtype", "?")),
            str(first.get("device", "?")),
            any(bool(p.get("requires_grad", True)) for p in members),
            all(bool(p.get("in_optimizer", True)) for p in members),
        )

    # -- output --------------------------------------------------------------------------------

    def frame(self, status: str, detail: bool = True) -> Frame:
        step = int(self.steps.last("step")) if len(self.steps) else 0
        elapsed = self._last_time - self._first_time
        layers = self._layers
        state = FrameState(
            status=status,
            step=step,
            elapsed_s=elapsed if math.isfinite(elapsed) else 0.0,
            latest_sample=self._last_sample,
            alerts=self.alerts,
            extra_latest={"best_loss": self._best_loss, **clip_share(self.steps)},
            layers=(lambda: layers.frame(self._flags)) if layers is not None else None,
            spans=self.spans,
        )
        return self.builder.build(state, detail=detail)


def _floats(row: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
        elif value is None:
            out[key] = math.nan
    return out
