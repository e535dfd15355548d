"""Model summary and static checks for training bugs that no loss curve shows.

``summary`` counts parameters per module and estimates memory by dtype (parameters, gradients
and optimizer state). ``check_setup`` compares the model with its optimizer once, at attach:
parameters that will never be updated (missing from the optimizer, lr == 0) or updated twice
(in two groups). ``grads_never_arrived`` and ``first_non_finite`` are the small helpers the
sampler thread calls when it has per-parameter gradient norms.
"""

from __future__ import annotations

import html
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

# A model is summarised as "frozen base + trainable adapter" when it has frozen parameters and
# fewer than this fraction of its parameters are trainable (LoRA, prefix tuning, a new head).
ADAPTER_FRACTION = 0.10
MAX_TEXT_ROWS = 40  # module rows printed by __str__ (the HTML and DataFrame have all of them)

# Optimizer-state tensors kept per trainable parameter, each shaped and typed like the parameter
# (torch creates them with zeros_like). Options that add a state are handled in _states_per_param.
_STATES = {
    "Adam": 2,
    "AdamW": 2,
    "NAdam": 2,
    "RAdam": 2,
    "Adamax": 2,
    "SparseAdam": 2,
    "Adadelta": 2,
    "Rprop": 2,
    "Adagrad": 1,
    "ASGD": 1,
    "Muon": 1,
}


# -- formatting ----------------------------------------------------------------------------------


def _count(n: int) -> str:
    """1234 -> '1.23K', 1_200_000 -> '1.2M'."""
    for size, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= size:
            return f"{n / size:.3g}{suffix}"
    return str(n)


def _bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- summary -------------------------------------------------------------------------------------


@dataclass
class ModelSummary:
    """Parameters per module and memory by dtype; a table in a notebook, text in a console."""

    model: str  # the model's class name
    rows: list[dict[str, object]]  # module, type, params, trainable, frozen
    by_dtype: dict[str, dict[str, int | None]]  # params, param_bytes, grad_bytes, optimizer_bytes
    total_params: int
    trainable_params: int
    frozen_params: int
    optimizer: str  # how the optimizer-state bytes were obtained, in words
    adapter: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def adapter_text(self) -> str:
        """'frozen base 1.2M params + trainable adapter 16.4K params (1.3%)', or ''."""
        if not self.adapter:
            return ""
        share = self.trainable_params / self.total_params
        return (
            f"frozen base {_count(self.frozen_params)} params + trainable adapter "
            f"{_count(self.trainable_params)} params ({share:.1%})"
        )

    def total_bytes(self) -> int | None:
        """Parameters + gradients + optimizer state (None when the optimizer is unknown)."""
        total = 0
        for entry in self.by_dtype.values():
            opt = entry["optimizer_bytes"]
            if opt is None:
                return None
            total += int(entry["param_bytes"] or 0) + int(entry["grad_bytes"] or 0) + opt
        return total

    def headline(self) -> str:
        head = (
            f"{self.model}: {self.total_params:,} params ({self.trainable_params:,} trainable, "
            f"{self.frozen_params:,} frozen)"
        )
        if self.adapter:
            head += f"; {self.adapter_text}"
        return head

    def _dtype_rows(self) -> list[list[str]]:
        rows = []
        for dtype, e in self.by_dtype.items():
            rows.append(
                [
                    dtype,
                    f"{int(e['params'] or 0):,}",
                    _bytes(e["param_bytes"]),
                    _bytes(e["grad_bytes"]),
                    _bytes(e["optimizer_bytes"]),
                ]
            )
        return rows

    def __str__(self) -> str:
        lines = [self.headline(), ""]
        header = ["module", "type", "params", "trainable", "frozen"]
        body = [
            [
                str(r["module"]) or "(root)",
                str(r["type"]),
                f"{r['params']:,}",
                f"{r['trainable']:,}",
                f"{r['frozen']:,}",
            ]
            for r in self.rows[:MAX_TEXT_ROWS]
        ]
        lines += _text_table(header, body)
        if len(self.rows) > MAX_TEXT_ROWS:
            lines.append(f"... and {len(self.rows) - MAX_TEXT_ROWS} more modules")
        lines.append("")
        dtype_header = ["dtype", "params", "param memory", "grad memory", "optimizer state"]
        lines += _text_table(dtype_header, self._dtype_rows())
        lines.append("")
        lines.append(f"total (params + grads + optimizer state): {_bytes(self.total_bytes())}")
        lines.append(f"optimizer state: {self.optimizer}")
        lines += self.notes
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = html.escape
        module_rows = "".join(
            "<tr>"
            f"<td><code>{e(str(r['module']) or '(root)')}</code></td><td>{e(str(r['type']))}</td>"
            f"<td>{r['params']:,}</td><td>{r['trainable']:,}</td><td>{r['frozen']:,}</td>"
            "</tr>"
            for r in self.rows
        )
        dtype_rows = "".join(
            "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
            for row in self._dtype_rows()
        )
        notes = "".join(f"<div>{e(n)}</div>" for n in self.notes)
        style = "text-align:right"
        return (
            '<div class="nbmonitor-summary">'
            f"<div><b>{e(self.headline())}</b></div>"
            f'<table style="{style}"><thead><tr><th>module</th><th>type</th><th>params</th>'
            f"<th>trainable</th><th>frozen</th></tr></thead><tbody>{module_rows}</tbody></table>"
            f'<table style="{style}"><thead><tr><th>dtype</th><th>params</th>'
            "<th>param memory</th><th>grad memory</th><th>optimizer state</th></tr></thead>"
            f"<tbody>{dtype_rows}</tbody></table>"
            f"<div>total (params + grads + optimizer state): {e(_bytes(self.total_bytes()))}"
            f"</div><div>optimizer state: {e(self.optimizer)}</div>{notes}</div>"
        )

    def to_pandas(self) -> Any:
        """The module rows as a pandas DataFrame (pandas is imported only here)."""
        # import_module keeps pandas optional for type checking too (no stubs needed).
        pd = importlib.import_module("pandas")
        return pd.DataFrame(self.rows, columns=["module", "type", "params", "trainable", "frozen"])


def _text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _owned_parameters(
    model: torch.nn.Module,
) -> Iterator[tuple[str, torch.nn.Module, list[torch.nn.Parameter]]]:
    """(qualified name, module, parameters it owns directly), each parameter once.

    A tied parameter counts for the first module that owns it, as in model.named_parameters().
    """
    seen: set[int] = set()
    for name, module in model.named_modules():
        own = []
        for _, p in module.named_parameters(recurse=False):
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                own.append(p)
        if own:
            yield name, module, own


def _states_per_param(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> float | None:
    """Optimizer-state tensors per parameter for one param group (None: unknown optimizer)."""
    name = type(optimizer).__name__
    if name in ("Adam", "AdamW"):
        return 3.0 if group.get("amsgrad") else 2.0
    if name == "SGD":
        return 1.0 if group.get("momentum", 0) else 0.0
    if name == "RMSprop":
        return 1.0 + bool(group.get("momentum", 0)) + bool(group.get("centered"))
    if name in _STATES:
        return float(_STATES[name])
    return None


def _adafactor_elements(p: torch.Tensor) -> int:
    # torch's Adafactor keeps factored row and column second moments for a matrix, a full one
    # for a vector, and no first moment by default.
    if p.dim() < 2:
        return p.numel()
    return p.numel() // p.shape[-1] + p.numel() // p.shape[-2]


def _state_bytes(
    optimizer: torch.optim.Optimizer, p: torch.nn.Parameter, group: dict[str, Any]
) -> tuple[int | None, bool]:
    """(bytes of optimizer state for ``p``, whether measured rather than estimated)."""
    state = optimizer.state.get(p)
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)] if state else []
    if tensors:
        return sum(v.numel() * v.element_size() for v in tensors), True
    if type(optimizer).__name__ == "Adafactor":
        return _adafactor_elements(p) * p.element_size(), False
    per = _states_per_param(optimizer, group)
    if per is None:
        return None, False
    return int(per * p.numel() * p.element_size()), False


def summary(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> ModelSummary:
    """Parameters per module (trainable / frozen) and memory by dtype.

    Gradient memory counts trainable parameters. Optimizer state is measured from
    ``optimizer.state`` once the optimizer has stepped, and estimated from its class before
    (without an optimizer, AdamW is assumed). Shows as a table in a notebook and as text
    with ``print()``; ``.to_pandas()`` gives the module rows as a DataFrame, ``.total_bytes()``
    the sum (None when the optimizer is unknown), ``.headline()`` one line.

    >>> import torch
    >>> s = nbmonitor.summary(torch.nn.Linear(4, 2))
    >>> s.headline()
    'Linear: 10 params (10 trainable, 0 frozen)'
    >>> s.total_bytes()  # 40 B of weights, 40 of gradients, 80 of AdamW's two moments
    160
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"nbmonitor.summary: model must be a torch.nn.Module, got {type(model).__name__}."
        )
    rows: list[dict[str, object]] = []
    by_dtype: dict[str, dict[str, int | None]] = {}
    total_params = trainable_params = 0
    for name, module, params in _owned_parameters(model):
        trainable = sum(p.numel() for p in params if p.requires_grad)
        total = sum(p.numel() for p in params)
        total_params += total
        trainable_params += trainable
        rows.append(
            {
                "module": name,
                "type": type(module).__name__,
                "params": total,
                "trainable": trainable,
                "frozen": total - trainable,
            }
        )
        for p in params:
            entry = by_dtype.setdefault(
                _dtype_name(p.dtype),
                {"params": 0, "param_bytes": 0, "grad_bytes": 0, "optimizer_bytes": 0},
            )
            size = p.numel() * p.element_size()
            entry["params"] = int(entry["params"] or 0) + p.numel()
            entry["param_bytes"] = int(entry["param_bytes"] or 0) + size
            if p.requires_grad:
                entry["grad_bytes"] = int(entry["grad_bytes"] or 0) + size

    if optimizer is None:
        how = "estimate, AdamW assumed (no optimizer given): 2 states per trainable parameter"
        for _, _, params in _owned_parameters(model):
            for p in params:
                if p.requires_grad:
                    entry = by_dtype[_dtype_name(p.dtype)]
                    entry["optimizer_bytes"] = int(entry["optimizer_bytes"] or 0) + 2 * (
                        p.numel() * p.element_size()
                    )
    else:
        how = _optimizer_bytes(model, optimizer, by_dtype)

    frozen_params = total_params - trainable_params
    adapter = (
        frozen_params > 0
        and trainable_params > 0
        and trainable_params < ADAPTER_FRACTION * total_params
    )
    notes = []
    if trainable_params == 0 and total_params:
        notes.append("Every parameter is frozen (requires_grad=False): nothing will train.")
    return ModelSummary(
        model=type(model).__name__,
        rows=rows,
        by_dtype=by_dtype,
        total_params=total_params,
        trainable_params=trainable_params,
        frozen_params=frozen_params,
        optimizer=how,
        adapter=adapter,
        notes=notes,
    )


def _optimizer_bytes(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    by_dtype: dict[str, dict[str, int | None]],
) -> str:
    """Add each dtype's optimizer-state bytes; return how they were obtained, in words."""
    in_model = {id(p) for p in model.parameters()}
    seen: set[int] = set()
    measured = estimated = 0
    unknown = False
    for group in optimizer.param_groups:
        for p in group["params"]:
            # Frozen parameters get no gradient, so the optimizer keeps no state for them.
            if id(p) in seen or id(p) not in in_model or not p.requires_grad:
                continue
            seen.add(id(p))
            nbytes, was_measured = _state_bytes(optimizer, p, group)
            entry = by_dtype[_dtype_name(p.dtype)]
            if nbytes is None or entry["optimizer_bytes"] is None:
                unknown = True
                entry["optimizer_bytes"] = None
                continue
            entry["optimizer_bytes"] = int(entry["optimizer_bytes"]) + nbytes
            measured += was_measured
            estimated += not was_measured
    name = type(optimizer).__name__
    if unknown:
        return f"unknown for {name} (not a recognised optimizer and no state yet)"
    if measured and not estimated:
        return f"measured from {name}.state"
    if name == "Adafactor":
        return "estimate for Adafactor: factored second moments (rows + columns)"
    per = {_states_per_param(optimizer, g) for g in optimizer.param_groups}
    states = ", ".join(f"{s:g}" for s in sorted(x for x in per if x is not None))
    text = f"estimate for {name}: {states} state(s) per trainable parameter, in its dtype"
    return text + (" (partly measured)" if measured else "")


# -- static checks -------------------------------------------------------------------------------


__all__ = [
    "ModelSummary",
    "summary",
]
