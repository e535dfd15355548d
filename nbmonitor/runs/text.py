"""Text that came from a run folder, made safe to print on a terminal.

A run's name, backend, start time, alert messages and metric keys are whatever the files say:
an escape sequence in any of them could retitle, clear or reprogram the terminal that prints
it (``nbmonitor runs``, ``nbmonitor tail``). Everything printed from a file goes through
:func:`printable` first. Stdlib only.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator
from typing import TextIO

# C0 and C1 control characters and DEL (ESC among them), and the Unicode format characters
# that reorder or hide text (bidirectional overrides, zero-width joiners).
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]"
)


def printable(text: object, limit: int = 400) -> str:
    """``text`` (``str()`` of it) with every control character shown as ``?``, lone surrogates
    too, and cut to ``limit`` characters."""
    s = text if isinstance(text, str) else str(text)
    s = _CONTROL.sub("?", s)
    return s if len(s) <= limit else s[: limit - 3] + "..."


_CONTROL_BUT_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]"
)


def strip_controls(text: str) -> str:
    """``text`` with every control character but newline and tab shown as ``?``: what a
    terminal may be sent of output that holds text from a file."""
    return _CONTROL_BUT_LINES.sub("?", text)


class StrippedStream(io.TextIOBase):
    """A text stream that passes on what it is given through :func:`strip_controls`."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, s: str) -> int:
        self._stream.write(strip_controls(s))
        return len(s)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def raw(self) -> TextIO:
        """The stream itself, for text of our own with control characters (the export
        command's progress bar and its carriage return)."""
        return self._stream


@contextlib.contextmanager
def stripped_output() -> Iterator[None]:
    """stdout and stderr with control characters shown as ``?`` while a follow or a listing
    prints what run folders hold (a console view, a logging handler made meanwhile)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = StrippedStream(out), StrippedStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


__all__ = ["StrippedStream", "printable", "strip_controls", "stripped_output"]
