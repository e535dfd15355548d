"""The alert: one health finding, with what it is about held as data.

``subject`` says what the alert is about in a form code can read (a metric key, a device, the
layers it lists, the setup), so that nothing downstream (de-duplication, the dashboard, a
sink) parses the plain-language ``message``, which is free to change wording.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Alert:
    """A health finding shown in the alerts strip and written to the run log."""

    rule: str
    severity: str  # "info" | "warning" | "error"
    message: str  # plain-language diagnosis with a hint; for people, never parsed
    step: int
    time: float
    layers: tuple[str, ...] = ()
    subject: str = RUN  # what it is about, as data: one of SUBJECTS or gpu(i)


__all__ = [
    "BACKEND",
    "GRAD_NORM",
    "LAYERS",
    "LOSS",
    "MPS",
    "RUN",
    "SETUP",
    "SUBJECTS",
    "Alert",
    "gpu",
    "is_subject",
    "rank",
]
