"""The structural facts of a run, as the health rules read them: what the training side read
of the model, the optimizer, the loss's autograd graph and the loop's order of ``zero_grad``,
``backward`` and ``step``, without a sync (``_capture/structure.py`` reads them; the records
are ``records.StructureRecord``).

Each observation is ``(step, kind, facts)``: ``kind`` "model" and "optimizer" once (at attach,
or when an optimizer is adopted), the others on sampled steps: "forward" (the modes of the
modules whose train/eval differs, dropout rates, float16 autocast, the first layer's input
scale), "batchnorm" (the batch a BatchNorm layer in training mode sees), "backward" (the loss's
graph; whether the gradients were reset since the last step; whether a forward ran since it),
"pre_step" (whether the gradients of the step's backward were still there at ``step()``).
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

# The observations kept per kind: enough for the rules' streaks, bounded whatever the run's
# length.
KEEP = 64

Facts = Mapping[str, object]


@dataclass(frozen=True)
class Observation:
    step: int
    kind: str
    facts: Facts

    def get(self, key: str, default: object = None) -> object:
        return self.facts.get(key, default)

    def number(self, key: str) -> float | None:
        value = self.facts.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return None


@dataclass(frozen=True)
class Structure:
    """A snapshot of the structural facts seen so far, in step order (``until`` cuts it at a
    step, as a check there would have seen it)."""

    observations: tuple[Observation, ...] = ()

    @functools.cached_property
    def _by_kind(self) -> dict[str, tuple[Observation, ...]]:
        """The observations of each kind, in order: made once a snapshot (a pass's rules ask
        a dozen times, each for one kind of a hundred observations)."""
        kinds: dict[str, list[Observation]] = {}
        for o in self.observations:
            kinds.setdefault(o.kind, []).append(o)
        return {kind: tuple(kept) for kind, kept in kinds.items()}

    @functools.cached_property
    def _steps(self) -> list[int] | None:
        """The observations' steps when in step order (as a snapshot makes them), else None."""
        steps = [o.step for o in self.observations]
        return steps if all(a <= b for a, b in itertools.pairwise(steps)) else None

    def of(self, kind: str) -> tuple[Observation, ...]:
        return self._by_kind.get(kind, ())

    def latest(self, kind: str) -> Observation | None:
        kept = self._by_kind.get(kind)
        return kept[-1] if kept else None

    def recent(self, kind: str, n: int, key: str | None = None) -> tuple[Observation, ...]:
        """The newest ``n`` observations of ``kind`` (those where ``key`` is known, not
        None, when given), oldest first."""
        kept = self._by_kind.get(kind, ())
        if key is None:
            return kept[max(0, len(kept) - max(n, 1)) :]  # at least one, as the loop below
        out: list[Observation] = []
        for o in reversed(kept):
            if o.facts.get(key) is not None:
                out.append(o)
                if len(out) >= n:
                    break
        return tuple(reversed(out))

    def held_since(self, kind: str, key: str | None, least: int, holds: object) -> int | None:
        """``streak_step`` over every kept observation of ``kind`` (with ``key`` known)."""
        return streak_step(self.recent(kind, KEEP, key), least, holds)

    @functools.cached_property
    def _kind_steps(self) -> dict[str, list[int]]:
        return {kind: [o.step for o in kept] for kind, kept in self._by_kind.items()}

    def until(self, step: float) -> Structure:
        steps = self._steps
        if steps is None:
            kept = tuple(o for o in self.observations if o.step <= step)
            return self if len(kept) == len(self.observations) else Structure(kept)
        n = bisect.bisect_right(steps, step)
        if n == len(steps):
            return self
        cut = Structure(self.observations[:n])
        # Its index and steps cut alike (each kind's observations are in step order too), so
        # that each slice of a check does not index its cut anew.
        index: dict[str, tuple[Observation, ...]] = {}
        for kind, of_kind in self._kind_steps.items():
            k = bisect.bisect_right(of_kind, step)
            if k:
                index[kind] = self._by_kind[kind][:k]
        # (functools.cached_property keeps its value in the instance's __dict__, which a
        # frozen dataclass leaves writable: the cut's two properties given, not worked out)
        cut.__dict__["_by_kind"] = index
        cut.__dict__["_steps"] = steps[:n]
        return cut

    def __bool__(self) -> bool:
        return bool(self.observations)


class StructureLog:
    """The observations of a run (sampler thread): the newest ``KEEP`` of each kind."""

    def __init__(self) -> None:
        self._kinds: dict[str, deque[Observation]] = {}
        # The last snapshot, while nothing was added since (a check takes one a tick; the
        # structure changes on sampled steps only): the same object, its index made once.
        self._snapshot: Structure | None = None

    def add(self, step: int, kind: str, facts: Facts) -> None:
        kept = self._kinds.get(kind)
        if kept is None:
            kept = self._kinds[kind] = deque(maxlen=KEEP)
        kept.append(Observation(step, kind, dict(facts)))
        self._snapshot = None

    def seen(self, kind: str) -> bool:
        """Whether an observation of ``kind`` was taken."""
        return bool(self._kinds.get(kind))

    def snapshot(self) -> Structure | None:
        if not self._kinds:
            return None
        if self._snapshot is None:
            everything = [o for kept in self._kinds.values() for o in kept]
            everything.sort(key=lambda o: o.step)
            self._snapshot = Structure(tuple(everything))
        return self._snapshot

    def clear(self) -> None:
        self._kinds.clear()
        self._snapshot = None


def streak_step(observations: tuple[Observation, ...], least: int, holds: object) -> int | None:
    """The step at which the newest run of observations for which ``holds`` is true reached
    ``least`` of them (when the verdict could first be said), or None when the newest ones
    do not hold that many times in a row."""
    if not callable(holds):
        return None
    run = 0
    for o in reversed(observations):
        if not holds(o):
            break
        run += 1
    if run < least:
        return None
    return observations[len(observations) - run + least - 1].step


def structure_of(view_inp: object) -> Structure | None:
    """The structure of a ``HealthInput`` (None when nothing was read)."""
    structure = getattr(view_inp, "structure", None)
    return structure if isinstance(structure, Structure) and structure else None


class Checked(Protocol):
    """What a structural rule reads of a check (``health.view.HealthView``)."""

    @property
    def inp(self) -> object: ...

    @property
    def has_new_rows(self) -> bool: ...


def to_judge(view: Checked) -> Structure | None:
    """What a structural rule judges at a check: the run's structural facts, or None when there
    is nothing to judge (none read yet, or no new rows since the last check)."""
    structure = structure_of(view.inp)
    return structure if structure is not None and view.has_new_rows else None


def observed(
    view: Checked,
    kind: str,
    n: int,
    least: int,
    *,
    key: str | None = None,
    keep: Callable[[Observation], object] | None = None,
) -> tuple[Structure, tuple[Observation, ...]] | None:
    """The start every structural rule shares: the run's structure and the newest ``n``
    observations of ``kind`` (those where ``key`` is known, and that ``keep`` accepts, when
    given; oldest first), or None when there is nothing to judge: no structure read, no new
    rows since the last check, or fewer than ``least`` such observations."""
    structure = to_judge(view)
    if structure is None:
        return None
    obs = structure.recent(kind, n, key)
    if keep is not None:
        obs = tuple(o for o in obs if keep(o))
    if len(obs) < least:
        return None
    return structure, obs


def steady(observations: tuple[Observation, ...], least: int, holds: object) -> bool:
    """Whether at least ``least`` observations exist and ``holds`` (a predicate) is true of
    every one: a structural fact seen on consecutive sampled steps, not once by chance."""
    if len(observations) < least or not callable(holds):
        return False
    return all(holds(o) for o in observations)


__all__ = [
    "KEEP",
    "Checked",
    "Facts",
    "Observation",
    "Structure",
    "StructureLog",
    "observed",
    "steady",
    "streak_step",
    "structure_of",
    "to_judge",
]
