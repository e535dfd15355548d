"""From per-step gradient norms and per-layer records to the layer statistics (sampler only).

Finite gradient norms of a tick wait (bounded) for whoever reads the layers next, and are then
taken in one numpy pass: per tick that pass was a sixth of the sampler's time, most of it per
call, not per step. A non-finite step, or a forward check's measurements, take the waiting
ones first, so that a non-finite gradient report names the module of its own episode; the
update ratios and activations of a sampled step touch nothing the gradient norms do and are
taken as they come.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.assemble.flow_alerts import first_non_finite, grads_never_arrived, stopped
from nbmonitor._engine.assemble.layers import LayerStats
from nbmonitor._engine.assemble.step_norms import LayerNorms
from nbmonitor.health.alert import Alert
from nbmonitor.health.wording import label
from nbmonitor.records import AuxRecord

# Finite per-layer gradient norms wait for their readers, but never more than this many values.
LAYER_DEFER_MAX_VALUES = 2**20
# Steps after which a trainable parameter that never received a gradient is reported.
NO_GRAD_AFTER_STEPS = 10
# The per-layer records that neither read nor change what the gradient norms do (the update
# ratios and parameter norms, the activations), so that they need not reach the statistics
# in step order with them; a forward check's (the module a non-finite gradient report names)
# and a stop's (its alert after the gradients' own) do.
_APART = frozenset(("update", "activations"))

# (step, time, names of the first bad parameters, first bad forward, forward checked) -> alert
NonFiniteReport = Callable[
    [int, float, list[str], "tuple[int, str, tuple[float, float, float]] | None", bool], Alert
]


class LayerFlow:
    def __init__(
        self,
        layers: LayerStats,
        add_alerts: Callable[[Iterable[Alert]], None],
        non_finite_report: NonFiniteReport,
        *,
        forward_checked: bool,
        clock: Callable[[], float],
        loop_watched: Callable[[], bool] = lambda: False,
    ) -> None:
        self.layers = layers
        # Whether the structural watch saw the loop's backward passes (health/rules/
        # loop_order.py, loss_graph.py): when no parameter at all got a gradient, those rules
        # name why (a detached loss, zero_grad before step, step before backward), which a
        # "detached branch" cannot be.
        self._loop_watched = loop_watched
        self._add_alerts = add_alerts
        self._report = non_finite_report
        self._forward_checked = forward_checked
        self._clock = clock
        self._deferred: list[LayerNorms] = []
        self._deferred_values = 0
        self._nonfinite_reported = False
        self._no_grad_checked = False
        self._first_step: int | None = None  # the first step with gradient norms
        # Per-layer rows (parameter norms, update ratios) not yet handed to the sinks.
        self.pending_rows: list[dict[str, float]] = []

    @property
    def waiting_values(self) -> int:
        """Finite gradient norms waiting for a reader of the layers."""
        return self._deferred_values

    def add(
        self, blocks: list[LayerNorms], aux: list[tuple[AuxRecord, list[float]]], step: int
    ) -> None:
        """Take one tick's gradient-norm blocks and per-layer records; ``step`` is the newest."""
        if self._first_step is None and blocks and blocks[0].steps:
            self._first_step = blocks[0].steps[0]
        if aux and any(record.kind in _APART for record, _ in aux):
            # Taken as they come: no gradient norm waits for them (a sampled step's update
            # ratios every ``layer_every`` steps would cut a tick's rows into a pass each).
            for record, values in sorted(aux, key=_aux_step):
                if record.kind in _APART:
                    self._take_aux(record, values)
            aux = [item for item in aux if item[0].kind not in _APART]
        if not aux and all(block.finite.all() for block in blocks):
            for block in blocks:
                self._defer(block)
        else:
            self._in_order(blocks, aux)
        if not self._no_grad_checked and step >= NO_GRAD_AFTER_STEPS:
            self._no_grad_checked = True
            self.take_waiting()
            layers = self.layers
            trainable = [p.requires_grad for p in layers.params]
            names = [p.name for p, t in zip(layers.params, trainable, strict=True) if t]
            seen = layers.seen[np.asarray(trainable, dtype=bool)]
            # Stamped where it became known (NO_GRAD_AFTER_STEPS steps in), not at the tick
            # that checked it, which depends on how fast the loop ran.
            first = self._first_step if self._first_step is not None else 1
            at = min(step, first + NO_GRAD_AFTER_STEPS - 1)
            if seen.size and not seen.any() and self._loop_watched():
                return
            alert = grads_never_arrived(names, seen, step=step, time=self._clock(), at=at)
            if alert is not None:
                self._add_alerts([alert])

    def _defer(self, block: LayerNorms) -> None:
        self._deferred.append(block)
        self._deferred_values += block.norms.size
        if self._deferred_values >= LAYER_DEFER_MAX_VALUES:
            self.take_waiting()

    def take_rows(self) -> list[dict[str, float]]:
        """The run-log rows made since the last call (the per-layer values of measured steps)."""
        out, self.pending_rows = self.pending_rows, []
        return out

    def take_waiting(self) -> None:
        """Hand the waiting finite gradient norms to the layer statistics, consecutive blocks
        of one index in one pass. Everything that reads the layers calls this first."""
        blocks, self._deferred, self._deferred_values = self._deferred, [], 0
        for index, group in itertools.groupby(blocks, key=lambda block: block.index):
            run = list(group)
            self._nonfinite_reported = False
            steps = [step for block in run for step in block.steps]
            norms = run[0].norms if len(run) == 1 else np.concatenate([b.norms for b in run])
            self.layers.add_grad_norm_rows(steps, norms, index)

    def _in_order(self, blocks: list[LayerNorms], aux: list[tuple[AuxRecord, list[float]]]) -> None:
        # In step order, and a step's forward measurements before its gradients. Finite steps
        # wait as in the usual tick, consecutive rows of a block as one slice of it (per row it
        # was an object and a call each, most of this pass); whatever else comes takes the
        # waiting ones first.
        if _rising(blocks):
            self._in_order_cut(blocks, aux)
            return
        work: list[tuple[int, int, AuxRecord | LayerNorms, int | list[float]]] = [
            (record.step, 0, record, values) for record, values in aux
        ]
        work += [(step, 1, block, k) for block in blocks for k, step in enumerate(block.steps)]
        run: tuple[LayerNorms, int, int] | None = None  # a block and its rows [start, end)
        for step, _, item, detail in sorted(work, key=lambda w: (w[0], w[1])):
            if isinstance(item, LayerNorms):
                assert isinstance(detail, int)
                if item.finite[detail]:
                    if run is not None and run[0] is item and run[2] == detail:
                        run = (item, run[1], detail + 1)
                    else:
                        self._defer_rows(run)
                        run = (item, detail, detail + 1)
                    continue
                self._defer_rows(run)
                run = None
                self.take_waiting()
                self._take_non_finite(step, item.norms[detail], item.index)
            else:
                assert isinstance(detail, list)
                self._defer_rows(run)
                run = None
                self.take_waiting()
                self._take_aux(item, detail)
        self._defer_rows(run)

    def _in_order_cut(
        self, blocks: list[LayerNorms], aux: list[tuple[AuxRecord, list[float]]]
    ) -> None:
        """``_in_order`` for blocks whose steps rise from one to the next (the usual tick):
        each block cut only where a per-layer record or a non-finite step comes between its
        rows, not visited row by row."""
        aux = sorted(aux, key=lambda item: item[0].step)  # stable: one step's in their order
        taken = 0
        for block in blocks:
            steps = block.steps
            bad = np.flatnonzero(~block.finite).tolist()
            at = 0
            while at < len(steps):
                next_aux = (
                    bisect.bisect_left(steps, aux[taken][0].step, at)
                    if taken < len(aux)
                    else len(steps)
                )
                next_bad = bad[0] if bad else len(steps)
                cut = min(next_aux, next_bad)
                if cut > at:
                    self._defer_rows((block, at, cut))
                    at = cut
                    continue
                self.take_waiting()
                if next_aux <= next_bad:  # a step's forward measurements before its gradients
                    self._take_aux(*aux[taken])
                    taken += 1
                else:
                    del bad[0]
                    self._take_non_finite(steps[at], block.norms[at], block.index)
                    at += 1
        for record, values in aux[taken:]:
            self.take_waiting()
            self._take_aux(record, values)

    def _defer_rows(self, run: tuple[LayerNorms, int, int] | None) -> None:
        if run is None:
            return
        block, start, end = run
        rows = slice(start, end)
        self._defer(
            LayerNorms(block.steps[rows], block.norms[rows], block.index, block.finite[rows])
        )

    def _take_aux(self, record: AuxRecord, values: list[float]) -> None:
        layers = self.layers
        if record.kind == "update":
            layers.add_update(values, record.step)
            row = {"step": float(record.step)}
            for name, pn, ur in zip(
                layers.names, layers.param_norm, layers.update_ratio, strict=True
            ):
                row[f"param_norm/{name}"] = float(pn)
                row[f"update_ratio/{name}"] = float(ur)
            self.pending_rows.append(row)
        elif record.kind == "forward":
            layers.add_forward(record.step, record.names, values)
        elif record.kind == "activations":
            layers.add_activations(record.names, values)
        elif record.kind == "stopped":
            forward = bool(values and values[0] == 1.0)
            alert = stopped(
                record.step, self._clock(), record.names, forward=forward, kinds=layers.module_kinds
            )
            self._add_alerts([alert])

    def _take_non_finite(
        self, step: int, norms: npt.NDArray[np.float64], index: tuple[int, ...] | None
    ) -> None:
        layers = self.layers
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
            if forward is not None:  # named as a layer: "layer 4 (Linear)", not "4"
                forward = (forward[0], label(forward[1], layers.module_kinds), forward[2])
            self._add_alerts(
                [self._report(step, self._clock(), bad, forward, self._forward_checked)]
            )
        self._nonfinite_reported = True
        layers.add_grad_norms(step, norms, index)


def _aux_step(item: tuple[AuxRecord, list[float]]) -> int:
    return item[0].step


def _rising(blocks: list[LayerNorms]) -> bool:
    """Every step of ``blocks`` after the one before it, across blocks too."""
    last = -math.inf
    for block in blocks:
        steps = block.steps
        if not steps:
            continue
        if steps[0] <= last or not all(map(operator.lt, steps, steps[1:])):
            return False
        last = steps[-1]
    return True


__all__ = ["LAYER_DEFER_MAX_VALUES", "NO_GRAD_AFTER_STEPS", "LayerFlow"]
