"""Secret-looking values are redacted before anything is written to disk (meta.json's argv).

A command line often carries credentials (``--hf-token=...``, ``--api-key KEY``,
``wandb.api_key=...``) and a run directory is shared, copied and committed far more freely than
a shell history. Names are matched loosely on purpose: redacting ``--keyframes 3`` costs a
little context, leaking a token costs the token.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "<redacted>"
# Matched anywhere in an option or variable name, case-insensitively.
_SECRET_NAME = re.compile(r"token|key|secret|passw(or)?d|credential|auth", re.IGNORECASE)
# user:password@ in a URL.
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]+(?=@)")


def is_secret_name(name: str) -> bool:
    return _SECRET_NAME.search(name) is not None


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of secret-looking options redacted: ``--token=abc``,
    ``--api-key abc``, ``NAME_TOKEN=abc`` / ``cfg.api_key=abc``, and passwords in URLs."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        if redact_next and not arg.startswith("--"):
            out.append(REDACTED)
            redact_next = False
            continue
        redact_next = False
        name, eq, _ = arg.partition("=")
        if eq and is_secret_name(name):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and not eq and is_secret_name(arg):
            out.append(arg)
            redact_next = True
        else:
            out.append(_URL_CREDENTIALS.sub(REDACTED, arg))
    return out
