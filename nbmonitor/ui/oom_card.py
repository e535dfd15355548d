"""The card shown under a notebook cell whose error was an out-of-memory error
(``nbmonitor.memory.OomReport``, built by ``live/oom.py``): HTML with a text fallback, and a
button that calls ``free_oom``."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

from nbmonitor.memory import CATEGORIES, OomReport, fmt_bytes

_VIZ = "https://pytorch.org/memory_viz"
_PLACE = {"cuda": "CUDA", "mps": "MPS", "cpu": "CPU"}


def _where(report: OomReport) -> str:
    parts = []
    if math.isfinite(report.requested_bytes):
        parts.append(f"allocating {fmt_bytes(report.requested_bytes)}")
    if report.phase:
        parts.append(f"in the {report.phase}")
    if report.module:
        parts.append(f"of module {report.module}")
    parts.append(f"at step {report.step + 1}")
    return " ".join(parts)


def card_text(report: OomReport) -> str:
    """The card as plain text (a terminal, a saved notebook)."""
    lines = [
        f"nbmonitor: {_PLACE.get(report.kind, report.kind)} out of memory, {_where(report)}.",
        f"  {report.message}",
    ]
    b = report.breakdown
    if b is not None:
        held = ", ".join(f"{c} {fmt_bytes(v)}" for c, v in b.by_category().items() if v)
        lines.append(f"  held: {held or 'nothing measured'}")
    if report.peaks:
        peaks = ", ".join(f"{s}: {fmt_bytes(v)}" for s, v in report.peaks[-5:])
        lines.append(f"  last peaks (step: bytes): {peaks}")
    for t in report.tensors:
        lines.append(
            f"  {fmt_bytes(t.nbytes):>10}  {t.dtype} {list(t.shape)} on {t.device}: {t.what}"
        )
    lines += [f"  - {a}" for a in report.advice]
    if report.snapshot:
        lines.append(f"  memory snapshot at the failure: {report.snapshot} ({_VIZ})")
    return "\n".join(lines)


def card_html(report: OomReport) -> str:
    esc = html.escape
    b = report.breakdown
    rows = ""
    if b is not None:
        head = "".join(f"<th>{esc(c)}</th>" for c in ("module", *CATEGORIES))
        body = ""
        for module, cats in b.by_module().items():
            body += (
                f"<tr><td>{esc(module)}</td>"
                + "".join(f"<td>{fmt_bytes(cats[c])}</td>" for c in CATEGORIES)
                + "</tr>"
            )
        rows = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    peaks = "".join(f"<td title='step {s}'>{fmt_bytes(v)}</td>" for s, v in report.peaks[-8:])
    tensors = "".join(
        f"<tr><td>{fmt_bytes(t.nbytes)}</td><td>{esc(t.dtype)} {esc(str(list(t.shape)))}</td>"
        f"<td>{esc(t.device)}</td><td>{esc(t.what)}</td></tr>"
        for t in report.tensors
    )
    advice = "".join(f"<li>{esc(a)}</li>" for a in report.advice)
    return (
        "<div class='nbmonitor-oom' style='border-left:4px solid #d9534f;padding:4px 10px'>"
        f"<b>{esc(_PLACE.get(report.kind, report.kind))} out of memory</b>, "
        f"{esc(_where(report))}.<br><code>{esc(report.message)}</code>"
        f"<p><b>What held memory</b> (step {report.step})</p>{rows}"
        + (f"<p><b>Last peaks</b></p><table><tr>{peaks}</tr></table>" if peaks else "")
        + (
            "<p><b>Largest live tensors</b></p><table>"
            f"<tr><th>bytes</th><th>tensor</th><th>device</th><th>held by</th></tr>{tensors}"
            "</table>"
            if tensors
            else ""
        )
        + f"<p><b>What to change</b></p><ul>{advice}</ul>"
        + (
            f"<p>Memory snapshot at the failure: <code>{esc(report.snapshot)}</code> (open it "
            f"in <a href='{_VIZ}' target='_blank'>{_VIZ}</a>)</p>"
            if report.snapshot
            else ""
        )
        + "</div>"
    )


class OomCard:
    """What ``display`` shows: the HTML card, with its text for plain front ends."""

    def __init__(self, report: OomReport) -> None:
        self.report = report

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/html": card_html(self.report), "text/plain": card_text(self.report)}


def show_card(report: OomReport, free: Callable[[], object]) -> None:
    """Display the card under the current cell, with a button that calls ``free``."""
    from IPython.display import display

    display(OomCard(report))  # type: ignore[no-untyped-call]
    try:
        import ipywidgets
    except ImportError:
        return
    button = ipywidgets.Button(
        description="Free what this error holds",
        icon="trash",
        layout=ipywidgets.Layout(width="auto"),  # the default width cuts the label
    )
    out = ipywidgets.Output()

    def clicked(_: Any) -> None:
        button.disabled = True
        with out:
            print(free())

    button.on_click(clicked)
    display(ipywidgets.VBox([button, out]))  # type: ignore[no-untyped-call]
