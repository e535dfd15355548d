"""What holds a run's memory: the typed result of ``mon.memory()`` and ``run.memory()``.

A :class:`MemoryBreakdown` is a small table of rows, each the bytes of one *category*
(``parameters``, ``buffers``, ``gradients``, ``optimizer_state``, ``activations``) held by
one top-level module in one dtype on one device. It is plain data (no torch, no pandas):
``str()`` prints a table, ``to_pandas()`` gives a DataFrame when pandas is installed, and
``to_record()`` / ``from_record()`` are its form in the run folder (``memory.jsonl``,
docs/file-format.md), read back from an untrusted folder with bounded, typed checks.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

CATEGORIES = ("parameters", "buffers", "gradients", "optimizer_state", "activations")
# A module that is not a child of the model (an optimizer's parameter the model lacks) and the
# model's own parameters or saved tensors outside any child.
OTHER = "(other)"
ROOT = "(root)"
# Bounds on what a run folder may hand back (untrusted input).
MAX_ROWS = 4096
MAX_TEXT = 200


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """The bytes of one category held by one top-level module in one dtype on one device;
    ``tensors`` counts distinct storages (a storage shared by two tensors counts once)."""

    category: str
    module: str
    dtype: str
    device: str
    bytes: int
    tensors: int


def fmt_bytes(n: float) -> str:
    if not math.isfinite(n):
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class LiveTensor:
    """One live tensor named in an OOM card: its storage's bytes and what holds it."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    device: str
    what: str  # "parameter 0.weight", "local `x` in Block.forward (layers.3)", ...


@dataclass(frozen=True)
class OomReport:
    """What the card under a cell says about an out-of-memory error (plain data: it holds no
    tensor and not the exception). ``kind``: ``"cuda"``, ``"mps"`` or ``"cpu"``; ``module``
    and ``phase`` (``"forward"``, ``"backward"``, ``"optimizer step"``) where it failed, when
    the traceback tells; ``peaks``: (step, bytes) of the last samples of ``peak_key``."""

    kind: str
    message: str
    requested_bytes: float
    module: str | None
    phase: str | None
    step: int
    breakdown: MemoryBreakdown | None
    peaks: tuple[tuple[int, float], ...]
    peak_key: str
    tensors: tuple[LiveTensor, ...]
    advice: tuple[str, ...]
    figures: dict[str, float] = field(default_factory=dict)
    snapshot: str | None = None


@dataclass(frozen=True)
class Freed:
    """What ``mon.free_oom()`` gave back: ``what`` measured before and after."""

    what: str  # "CUDA memory allocated" or "resident memory (RSS)"
    before: float
    after: float
    released: tuple[str, ...]  # which references were dropped

    @property
    def freed_bytes(self) -> float:
        return self.before - self.after

    def __str__(self) -> str:
        dropped = ", ".join(self.released) or "nothing held"
        return (
            f"free_oom: {fmt_bytes(max(0.0, self.freed_bytes))} of {self.what} came back "
            f"({fmt_bytes(self.before)} -> {fmt_bytes(self.after)}); dropped: {dropped}."
        )

    def _repr_html_(self) -> str:
        return f"<div><b>{html.escape(str(self))}</b></div>"


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes held by parameters, gradients, optimizer state and (on a sampled step) the
    activations saved for backward, by category, top-level module and dtype.

    ``step`` is the step it was measured at (0: before the first); ``activations_step`` the
    sampled step the activation rows come from (None: none sampled yet). Parameters, gradients
    and optimizer state are exact: the bytes of their storages, each storage counted once.
    Activations are what autograd saved for one micro-batch's backward, outside the parameters.
    """

    rows: tuple[MemoryRow, ...]
    step: int = 0
    time: float = math.nan
    activations_step: int | None = None
    _totals: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    # (category, device) -> bytes: what ``bytes`` sums (the Memory tab and the batch estimate
    # ask it for every category of every device, each frame).
    _cells: dict[tuple[str, str], int] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        totals = dict.fromkeys(CATEGORIES, 0)
        cells: dict[tuple[str, str], int] = {}
        for row in self.rows:
            totals[row.category] = totals.get(row.category, 0) + row.bytes
            cell = (row.category, row.device)
            cells[cell] = cells.get(cell, 0) + row.bytes
        self._totals.update(totals)
        self._cells.update(cells)

    # -- reading ------------------------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        """Every row's bytes."""
        return sum(self._totals.values())

    def bytes(self, category: str | None = None, *, device: str | None = None) -> int:
        """The bytes of one category (all of them with None), on one device (``"cuda:0"``,
        ``"cpu"``) or all."""
        return sum(
            n
            for (c, d), n in self._cells.items()
            if (category is None or c == category) and (device is None or d == device)
        )

    def by_category(self) -> dict[str, int]:
        """Bytes per category, every category present (0 when none)."""
        return dict(self._totals)

    def by_module(self) -> dict[str, dict[str, int]]:
        """``{module: {category: bytes}}`` in first-seen module order."""
        out: dict[str, dict[str, int]] = {}
        for r in self.rows:
            slot = out.setdefault(r.module, dict.fromkeys(CATEGORIES, 0))
            slot[r.category] += r.bytes
        return out

    def by_dtype(self) -> dict[str, dict[str, int]]:
        """``{dtype: {category: bytes}}``."""
        out: dict[str, dict[str, int]] = {}
        for r in self.rows:
            slot = out.setdefault(r.dtype, dict.fromkeys(CATEGORIES, 0))
            slot[r.category] += r.bytes
        return out

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame (needs pandas)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError(
                "nbmonitor: MemoryBreakdown.to_pandas() needs pandas; pip install pandas."
            ) from exc
        columns = ("category", "module", "dtype", "device", "bytes", "tensors")
        return pd.DataFrame([[getattr(r, c) for c in columns] for r in self.rows], columns=columns)

    # -- showing ------------------------------------------------------------------------------

    def _table(self) -> list[tuple[str, ...]]:
        lines: list[tuple[str, ...]] = []
        for module, cats in self.by_module().items():
            lines.append((module, *(fmt_bytes(cats[c]) for c in CATEGORIES)))
        lines.append(("total", *(fmt_bytes(self._totals[c]) for c in CATEGORIES)))
        return lines

    def _title(self) -> str:
        act = (
            f", activations from step {self.activations_step}"
            if self.activations_step is not None
            else ", no activations sampled yet"
        )
        return f"memory at step {self.step}: {fmt_bytes(self.total_bytes)}{act}"

    def __str__(self) -> str:
        head = ("module", *CATEGORIES)
        lines = [head, *self._table()]
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        text = [self._title()]
        for line in lines:
            cells = [line[0].ljust(widths[0])]
            cells += [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)]
            text.append("  ".join(cells))
        return "\n".join(text)

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in ("module", *CATEGORIES))
        body = "".join(
            "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in line) + "</tr>" for line in self._table()
        )
        return (
            f"<div><b>{esc(self._title())}</b><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>"
        )

    # -- on disk ------------------------------------------------------------------------------

    def to_record(self) -> dict[str, object]:
        """The JSON form kept in the run folder's ``memory.jsonl``."""
        return {
            "step": self.step,
            "time": self.time,
            "activations_step": self.activations_step,
            "rows": [
                {
                    "category": r.category,
                    "module": r.module,
                    "dtype": r.dtype,
                    "device": r.device,
                    "bytes": r.bytes,
                    "tensors": r.tensors,
                }
                for r in self.rows
            ],
        }

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> MemoryBreakdown:
        """Read a ``to_record()`` dict from a run folder: ``ValueError`` (one line) for one that
        is not; at most ``MAX_ROWS`` rows, text cut to ``MAX_TEXT`` characters."""
        rows = record.get("rows")
        if not isinstance(rows, list) or len(rows) > MAX_ROWS:
            raise ValueError("nbmonitor: a memory record has no list of rows (or too many).")
        out = [_row(r) for r in rows]
        step = record.get("step")
        act = record.get("activations_step")
        when = record.get("time")
        return cls(
            tuple(out),
            step=int(step) if _is_int(step) else 0,
            time=float(when)
            if isinstance(when, (int, float)) and not isinstance(when, bool)
            else math.nan,
            activations_step=int(act) if _is_int(act) else None,
        )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _row(value: object) -> MemoryRow:
    if not isinstance(value, Mapping):
        raise ValueError("nbmonitor: a memory row is not an object.")
    text = []
    for key in ("category", "module", "dtype", "device"):
        v = value.get(key)
        if not isinstance(v, str):
            raise ValueError(f"nbmonitor: a memory row's {key} is not text.")
        text.append(v[:MAX_TEXT])
    numbers = []
    for key in ("bytes", "tensors"):
        v = value.get(key)
        if not _is_int(v) or not 0 <= v < 2**63:
            raise ValueError(f"nbmonitor: a memory row's {key} is not a count.")
        numbers.append(v)
    if text[0] not in CATEGORIES:
        raise ValueError(f"nbmonitor: unknown memory category {text[0]!r}.")
    return MemoryRow(text[0], text[1], text[2], text[3], numbers[0], numbers[1])
