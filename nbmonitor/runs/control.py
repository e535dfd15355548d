"""A live run's control directory: requests (pause, resume, stop, checkpoint, lr) written by
``nbmonitor ctl`` from another process and read by the run's sampler.

``<run_dir>/control/`` is made by the live run at attach (mode 0700). A request is one small
JSON file, written under a hidden temporary name and moved into place (``os.replace``), so a
reader never sees half of one: ``{"kind": "lr", "value": 0.001, "source": "ctl"}`` (and
``"at_step"``, a step to act at). The reader (``ControlReader.poll``, once per sampler tick)
costs one ``stat`` of the folder while nothing arrives; it accepts a file only if it is a
regular file (never a link or a FIFO: opened with ``O_NOFOLLOW | O_NONBLOCK``), owned by the
run's own user and not writable by group or others, small, and plain JSON. Every file read is
removed, accepted or not; a refused one is said in one line. Only the run that made the folder
reads it: a run folder received from elsewhere is never acted on (a replay reads no control).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

CONTROL = "control"
# A request is a few dozen bytes; more is not a request.
MAX_REQUEST_BYTES = 4096
# The most files one poll reads: a flood waits for the next ticks.
MAX_PER_POLL = 32
# Nesting allowed in a request's JSON (json.loads recurses without a limit of its own).
MAX_BRACKETS = 8
# A folder whose mtime is this recent is listed even when it did not change: two writes
# within the file system's timestamp granularity leave the same mtime.
RECENT_S = 2.0
VERBS = ("pause", "resume", "stop", "checkpoint", "lr")


@dataclass(frozen=True)
class ControlRequest:
    """A request read from the control directory (its values as the file gave them; the
    steering checks them)."""

    kind: str
    value: object
    source: str
    at_step: object
    file: str


@dataclass(frozen=True)
class Refused:
    """A file in the control directory that was not taken, and why (one line)."""

    file: str
    why: str


def control_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / CONTROL


def make_control_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Make the run's control directory, readable and writable by its owner only."""
    path = control_dir(run_dir)
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)  # whatever the umask made of it
    return path


def write_request(
    run_dir: str | os.PathLike[str],
    kind: str,
    value: object = None,
    *,
    source: str = "ctl",
    at_step: int | None = None,
) -> Path:
    """Write one request into ``run_dir``'s control directory, atomically, mode 0600.
    ``FileNotFoundError`` when the run has no control directory."""
    folder = control_dir(run_dir)
    record: dict[str, object] = {"kind": kind, "value": value, "source": source}
    if at_step is not None:
        record["at_step"] = at_step
    data = json.dumps(record).encode()
    stamp = f"{time.time_ns()}-{os.getpid()}"
    tmp = folder / f".{stamp}.tmp"
    final = folder / f"{stamp}.json"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o600)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


class ControlReader:
    """The live run's reader of its own control directory (made with ``make_control_dir``).

    ``uid`` is the run's owner (this process's user). ``keep``: leave the files read in
    place and remember their names (a job's folder, read by every rank: ``job_control.py``).
    """

    def __init__(
        self, run_dir: str | os.PathLike[str], uid: int | None = None, *, keep: bool = False
    ) -> None:
        self.path = control_dir(run_dir)
        self.uid = os.getuid() if uid is None else uid
        self.keep = keep
        self._seen: set[str] = set()
        self._mtime: int | None = None
        self._refused_dir = False

    def poll(self) -> list[ControlRequest | Refused]:
        """The requests (and refusals) that arrived since the last poll; one ``stat`` when
        none did. Never raises for what the folder holds."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return []
        recent = time.time() - st.st_mtime < RECENT_S
        if st.st_mtime_ns == self._mtime and not recent:
            return []
        self._mtime = st.st_mtime_ns
        why = self._bad_dir(st)
        if why is not None:
            if self._refused_dir:
                return []
            self._refused_dir = True
            return [Refused(CONTROL, why)]
        try:
            names = sorted(
                n for n in os.listdir(self.path) if not n.startswith(".") and n not in self._seen
            )
        except OSError:
            return []
        if self.keep:
            self._seen.update(names[:MAX_PER_POLL])
        out: list[ControlRequest | Refused] = []
        for name in names[:MAX_PER_POLL]:
            out.append(self._read(name))
        if len(names) > MAX_PER_POLL:
            self._mtime = None  # the rest at the next poll
        return out

    def _bad_dir(self, st: os.stat_result) -> str | None:
        if not stat.S_ISDIR(st.st_mode):
            return "the control folder is not a folder"
        if st.st_uid != self.uid:
            return f"the control folder is owned by uid {st.st_uid}, not the run's ({self.uid})"
        if st.st_mode & 0o022:
            return "the control folder is writable by group or others"
        return None

    def _read(self, name: str) -> ControlRequest | Refused:
        path = self.path / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            if not self.keep:
                _remove(path)
            return Refused(name, f"cannot be opened ({exc.strerror or exc})")
        try:
            st = os.fstat(fd)
            why = self._bad_file(st)
            data = b"" if why is not None else os.read(fd, MAX_REQUEST_BYTES + 1)
        except OSError as exc:
            why = f"cannot be read ({exc.strerror or exc})"
        finally:
            os.close(fd)
            if not self.keep:
                _remove(path)
        if why is not None:
            return Refused(name, why)
        if len(data) > MAX_REQUEST_BYTES:
            return Refused(name, f"is over {MAX_REQUEST_BYTES} bytes")
        return parse_request(name, data)

    def _bad_file(self, st: os.stat_result) -> str | None:
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file"
        if st.st_uid != self.uid:
            return f"is owned by uid {st.st_uid}, not the run's ({self.uid})"
        if st.st_mode & 0o022:
            return "is writable by group or others"
        return None


def parse_request(name: str, data: bytes) -> ControlRequest | Refused:
    """A request file's content, checked for shape (the steering checks the values)."""
    if data.count(b"[") + data.count(b"{") > MAX_BRACKETS:
        return Refused(name, "is not a request (too deeply nested)")
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return Refused(name, "is not JSON")
    if not isinstance(record, dict):
        return Refused(name, "is not a request (not a JSON object)")
    kind = record.get("kind")
    if not isinstance(kind, str) or kind not in VERBS:
        shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
        return Refused(name, f"asks for {shown!r}, not one of {', '.join(VERBS)}")
    source = record.get("source")
    source = source[:40] if isinstance(source, str) and source else "ctl"
    return ControlRequest(kind, record.get("value"), source, record.get("at_step"), name)


class ControlError(ValueError):
    """A ``nbmonitor ctl`` request that cannot be sent; the message is one line."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status  # the command's exit status


def parse_verb(text: str) -> tuple[str, object]:
    """``pause``, ``resume``, ``stop``, ``checkpoint``, ``checkpoint=PATH`` or ``lr=VALUE`` as
    ``(kind, value)``; ``ControlError`` (exit status 2) for anything else."""
    kind, sep, rest = text.partition("=")
    if kind not in VERBS:
        raise ControlError(
            f"unknown request {text[:40]!r}; use pause, resume, stop, checkpoint[=PATH] or "
            "lr=VALUE (e.g. lr=3e-4)",
            2,
        )
    if kind == "lr":
        try:
            value = float(rest) if sep else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise ControlError(f"lr needs a finite number >= 0, got {rest[:40]!r}; e.g. lr=3e-4", 2)
        return kind, value
    if kind == "checkpoint" and sep:
        if not rest:
            raise ControlError("checkpoint= needs a path, e.g. checkpoint=/tmp/ckpt.pt", 2)
        return kind, os.path.abspath(rest)  # the run's working folder may not be ours
    if sep:
        raise ControlError(f"{kind} takes no value, got {text[:40]!r}", 2)
    return kind, None


def send(
    run_dir: str | os.PathLike[str],
    verb: str,
    *,
    wait: float = 5.0,
    poll: float = 0.05,
) -> str:
    """Send ``verb`` (``parse_verb``) to the live run at ``run_dir`` and wait up to ``wait``
    seconds for it to take the request; what happened, in one line. ``ControlError`` (one
    line, with the exit status) when the run is not running or cannot be steered."""
    from nbmonitor.runs.reader import open_run

    kind, value = parse_verb(verb)
    path = Path(run_dir)
    run = open_run(path)  # RunNotFoundError: not a run
    name = path.name
    status = run.status
    if status != "running":
        raise ControlError(f"the run {name} is not running ({status}); nothing to steer")
    folder = control_dir(path)
    if not folder.is_dir():
        raise ControlError(
            f"the run {name} takes no requests (no {CONTROL}/ folder: "
            "written by an older nbmonitor); pass the run's own folder"
        )
    try:
        written = write_request(path, kind, value)
    except PermissionError:
        raise ControlError(
            f"cannot write to {folder}: permission denied (only the user who runs it can "
            "steer a run)"
        ) from None
    what = kind if value is None else f"{kind}={value:g}" if kind == "lr" else f"{kind} {value}"
    deadline = time.monotonic() + wait
    while os.path.lexists(written):
        if time.monotonic() >= deadline:
            return (
                f"sent {what} to {name}; the run has not read it yet (it reads its requests "
                "every sampling interval and acts at the end of the next step)"
            )
        time.sleep(poll)
    return f"sent {what} to {name}; the run took it and acts at the end of the next step"


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


__all__ = [
    "CONTROL",
    "VERBS",
    "ControlError",
    "ControlReader",
    "ControlRequest",
    "Refused",
    "control_dir",
    "make_control_dir",
    "parse_request",
    "parse_verb",
    "send",
    "write_request",
]
