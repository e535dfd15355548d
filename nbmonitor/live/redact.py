"""Secret-looking values are redacted before anything is written to disk (meta.json's argv).

A command line often carries credentials (``--hf-token=...``, ``--api-key KEY``,
``wandb.api_key=...``, a database URL with its password, a signed URL, an HTTP header) and a
run directory is shared, copied and committed far more freely than a shell history. Names are
matched loosely on purpose: redacting ``--keyframes 3`` costs a little context, leaking a token
costs the token. What is redacted (docs/reliability.md, "No secrets on disk"):

* the value of any option or ``NAME=value`` argument whose name contains ``pass``, ``pwd``,
  ``secret``, ``token``, ``key``, ``auth`` or ``credential`` (any case), in the ``=`` form and
  in the space-separated form (the next argument, unless it starts with ``--``);
* the userinfo of any URL (``scheme://anything@`` becomes ``scheme://<redacted>@``);
* the value of URL query parameters with such names or the usual signature names (``sig``,
  ``signature``, ``X-Amz-Signature``, ``code``...);
* HTTP ``Authorization``, ``Proxy-Authorization``, ``Cookie`` and ``Set-Cookie`` header values
  and ``Bearer``/``Basic`` credentials anywhere in an argument.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "<redacted>"
_WORDS = r"pass|pwd|secret|token|key|auth|credential"
# Matched anywhere in an option or variable name, case-insensitively.
_SECRET_NAME = re.compile(_WORDS, re.IGNORECASE)
# scheme://userinfo@ in a URL (userinfo: anything up to the @ before the host).
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s@]*@")
# ?name=value / &name=value / ;name=value where the name looks secret.
_QUERY = re.compile(
    rf"(?P<head>[?&;](?:[^=&;#\s]*(?:{_WORDS})[^=&;#\s]*|sig|signature|code|sas|x-amz-[a-z-]+)=)"
    r"[^&;#\s]*",
    re.IGNORECASE,
)
# Authorization: Bearer X / Cookie: a=b, in any argument (a -H/--header value).
_HEADER = re.compile(
    r"(?P<head>\b(?:proxy-)?authorization\s*[:=]\s*|\b(?:set-)?cookie\s*[:=]\s*)\S.*",
    re.IGNORECASE,
)
_SCHEME_CRED = re.compile(r"(?P<head>\b(?:bearer|basic|token)\s+)[A-Za-z0-9._~+/=\-]{8,}", re.I)


def is_secret_name(name: str) -> bool:
    return _SECRET_NAME.search(name) is not None


def redact_text(text: str) -> str:
    """``text`` with URL userinfo, secret query values and credential headers redacted."""
    text = _URL_USERINFO.sub(rf"\g<scheme>{REDACTED}@", text)
    text = _QUERY.sub(rf"\g<head>{REDACTED}", text)
    text = _HEADER.sub(rf"\g<head>{REDACTED}", text)
    return _SCHEME_CRED.sub(rf"\g<head>{REDACTED}", text)


def _is_option(arg: str) -> bool:
    return arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit()


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with secret-looking values redacted (module docstring): ``--token=abc``,
    ``--api-key abc``, ``--pass abc``, ``NAME_TOKEN=abc`` / ``cfg.api_key=abc``, URL userinfo
    and signed query parameters, ``Authorization``/``Cookie`` headers."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        if not isinstance(arg, str):
            arg = str(arg)
        if redact_next and not arg.startswith("--"):
            out.append(REDACTED)
            redact_next = False
            continue
        redact_next = False
        name, eq, _ = arg.partition("=")
        if eq and is_secret_name(name) and "://" not in name:
            out.append(f"{redact_text(name)}={REDACTED}")
        elif _is_option(arg) and not eq and is_secret_name(arg):
            out.append(arg)
            redact_next = True
        else:
            out.append(redact_text(arg))
    return out
