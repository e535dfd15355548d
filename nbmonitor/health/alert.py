"""The alert: one health finding, with what it is about held as data.

``subject`` says what the alert is about in a form code can read (a metric key, a device, the
layers it lists, the setup), so that nothing downstream (de-duplication, the dashboard, a
sink) parses the plain-language ``message``, which is free to change wording.

An alert that names a cause (DESIGN.md section 9) also carries, as data: ``cause`` (what the
user did, in their terms), ``evidence`` (the values, steps and layers it was judged on:
``evidence.py``), ``place`` (the layer, module or param group, where that is not ``layers``),
one ``fix``, and ``explains``, the symptom alerts it took in (``differential.py``). A symptom
alert (the last resort: no cause was supported) has an empty ``cause``. ``to_record`` and
``from_record`` are the one way an alert becomes a line of ``events.jsonl`` and back, so a
replayed run explains itself as the live one did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from nbmonitor.health.evidence import Evidence, EvidenceValue, cut, evidence_of

# The subjects an alert may have. A device is "gpu<N>" (the prefix of its metric keys, see
# ``gpu``) or "mps".
LOSS = "loss"  # the logged loss
GRAD_NORM = "grad_norm"  # the total gradient norm
LAYERS = "layers"  # the parameters or modules listed in Alert.layers
SETUP = "setup"  # how the model and optimizer were put together (static checks)
BACKEND = "backend"  # the monitoring backend itself (NVML missing, a GPU lost)
MPS = "mps"  # Apple's GPU
RUN = "run"  # the run as a whole: the default for alerts that name nothing narrower

SUBJECTS = frozenset({LOSS, GRAD_NORM, LAYERS, SETUP, BACKEND, MPS, RUN})


def gpu(index: int) -> str:
    """The subject of CUDA device ``index``: the prefix of its metric keys (``gpu0_...``)."""
    return f"gpu{index}"


def rank(index: int) -> str:
    """The subject of rank ``index`` of a distributed job (``rank1``)."""
    return f"rank{index}"


def is_subject(subject: str) -> bool:
    """Whether ``subject`` is one of ``SUBJECTS``, a GPU (``gpu<N>``) or a rank (``rank<N>``)."""
    if subject in SUBJECTS:
        return True
    for prefix in ("gpu", "rank"):
        if subject.startswith(prefix) and subject[len(prefix) :].isdigit():
            return True
    return False


SEVERITIES = ("info", "warning", "error")

# Bounds on what a record read from a run folder may bring (evidence has its own, in
# evidence.py); a rule's own alerts stay far inside them.
MAX_MESSAGE = 4000
MAX_LAYERS = 4096
MAX_EXPLAINS = 32
MAX_SHORT = 500  # cause, fix
MAX_NAME = 200  # rule, subject, place, a layer name

# A symptom alert a cause alert took in: (its rule, its step).
Explained = tuple[str, int]


@dataclass(frozen=True)
class Alert:
    """A health finding shown in the alerts strip and written to the run log.

    Fields: ``rule``; ``severity`` (``"info"``, ``"warning"``, ``"error"``); ``message`` (one
    line, for people); ``step``; ``time``; ``layers``; ``subject`` (what it is about, as data:
    ``loss``, ``grad_norm``, ``layers``, ``gpu0``, ``mps``, ``setup``, ``backend``, ``run``,
    ``rank<r>``); and, for a diagnosis, ``cause`` (what the user did, in their terms; empty
    for a symptom no cause explains), ``evidence`` (the values, steps and layers it was judged
    on: a small JSON-able dict; ``evidence["symptoms"]`` lists the symptoms it took in),
    ``place`` (a param group, a module, the loss: where, when that is not ``layers``), ``fix``
    (the one thing to do) and ``explains`` (the symptom alerts it took in, as
    ``(rule, step)``).

    ``evidence`` is bounded JSON data, made so when the alert is built (``evidence_of``); it
    is excluded from the hash and read, never modified. ``alert["rule"]`` reads the alert's
    record (``to_record``), as the dicts ``run.events()`` returned before it returned alerts.
    """

    rule: str
    severity: str  # "info" | "warning" | "error"
    message: str  # plain-language diagnosis with a hint; for people, never parsed
    step: int
    time: float
    layers: tuple[str, ...] = ()
    subject: str = RUN  # what it is about, as data: one of SUBJECTS or gpu(i)
    cause: str = ""  # what the user did, in their terms; "" for a symptom or a notice
    evidence: Evidence = field(default_factory=dict, hash=False)
    place: str = ""  # the layer, module or param group, where it is not ``layers``
    fix: str = ""  # the one thing to do
    explains: tuple[Explained, ...] = ()  # the symptom alerts it took in: (rule, step)

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", evidence_of(self.evidence))

    @property
    def is_cause(self) -> bool:
        """Whether the alert names a cause (what the user did), not only a symptom."""
        return bool(self.cause)

    def to_record(self) -> dict[str, Any]:
        """The alert as a line of ``events.jsonl`` (JSON data; ``from_record`` reads it)."""
        record: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        record["layers"] = list(self.layers)
        record["explains"] = [[rule, step] for rule, step in self.explains]
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Alert | None:
        """The alert a record of ``events.jsonl`` holds, typed and bounded whatever the file
        says (a run folder from elsewhere); None when it has no rule. Never raises."""
        rule = record.get("rule")
        if not isinstance(rule, str) or not rule:
            return None
        severity = record.get("severity")
        layers = record.get("layers")
        return cls(
            rule=cut(rule, MAX_NAME),
            severity=severity if severity in SEVERITIES else "info",
            message=_text(record.get("message"), MAX_MESSAGE),
            step=_int(record.get("step")),
            time=_float(record.get("time")),
            layers=tuple(
                cut(n, MAX_NAME) for n in _items(layers, MAX_LAYERS) if isinstance(n, str)
            ),
            subject=_text(record.get("subject"), MAX_NAME) or RUN,  # older runs: "run"
            cause=_text(record.get("cause"), MAX_SHORT),
            evidence=evidence_of(record.get("evidence")),
            place=_text(record.get("place"), MAX_NAME),
            fix=_text(record.get("fix"), MAX_SHORT),
            explains=tuple(
                (cut(e[0], MAX_NAME), _int(e[1]))
                for e in _items(record.get("explains"), MAX_EXPLAINS)
                if isinstance(e, list | tuple) and len(e) == 2 and isinstance(e[0], str)
            ),
        )

    def __getitem__(self, key: str) -> Any:
        return self.to_record()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """``alert[key]``, or ``default`` for a key an alert's record does not have."""
        return self.to_record().get(key, default)


def _text(value: object, limit: int) -> str:
    return cut(value, limit) if isinstance(value, str) else ""


def _int(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int) and -(2**53) <= value <= 2**53:
        return value
    if isinstance(value, float) and math.isfinite(value) and abs(value) <= 2**53:
        return int(value)
    return 0


def _float(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return math.nan


def _items(value: object, limit: int) -> list[Any]:
    return value[:limit] if isinstance(value, list) else []


__all__ = [
    "BACKEND",
    "GRAD_NORM",
    "LAYERS",
    "LOSS",
    "MPS",
    "RUN",
    "SETUP",
    "SEVERITIES",
    "SUBJECTS",
    "Alert",
    "EvidenceValue",
    "Explained",
    "gpu",
    "is_subject",
    "rank",
]
