"""The one place a run folder's files are opened: regular files inside the folder only.

A run folder is untrusted input (a colleague's run on a shared filesystem, an artefact from a
cluster, a folder someone else is still writing). Every reader in ``runs/`` opens its files
through :class:`RunFolder`, which

* opens each path component relative to the run folder's own descriptor with ``O_NOFOLLOW``
  (a symlink anywhere below the folder, ``..`` or an absolute name never leads out of it; the
  folder the caller names may itself be a symlink: that choice is the caller's);
* opens with ``O_NONBLOCK`` and checks ``fstat`` before reading, so a FIFO, a device or a
  socket put where a file belongs is refused at once instead of blocking or reading forever;
* reads at most the bound it is given, so a file that grows without end (``/dev/zero``, a
  writer gone wild) costs at most that.

What it refuses raises :class:`~nbmonitor.runs.format.RunUnsafeError`; a file it may not read
raises :class:`~nbmonitor.runs.format.RunUnreadableError`; a missing one ``FileNotFoundError``
(the callers decide whether that is normal: a stream with no records yet is). Never a bare
OSError. Any thread; stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import stat
from collections.abc import Iterator, Sequence
from typing import Any

from nbmonitor.runs.decode import loads_line
from nbmonitor.runs.format import (
    MAX_META_BYTES,
    META,
    RunCorruptError,
    RunNotFoundError,
    RunUnreadableError,
    RunUnsafeError,
    check_name,
)

HINT = "pass the folder of one run, e.g. runs/20240101-120000-run"
_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Opening each component relative to its folder needs dir_fd (every POSIX system).
_AT = os.open in os.supports_dir_fd and bool(_NOFOLLOW)


def _unreadable(where: object, exc: OSError) -> RunUnreadableError:
    reason = exc.strerror or type(exc).__name__
    return RunUnreadableError(f"nbmonitor: cannot read {where} ({reason}).")


class RunFolder:
    """The files of the run folder at ``path``, opened by the reading contract's rules.

    ``parts`` name a file by its components below the folder (``("columns", "steps",
    "000000.npz")``); each is checked with :func:`~nbmonitor.runs.format.check_name`.
    """

    __slots__ = ("path",)

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def where(self, parts: Sequence[str]) -> pathlib.Path:
        return self.path.joinpath(*parts)

    @contextlib.contextmanager
    def _open(self, parts: Sequence[str], directory: bool = False) -> Iterator[int]:
        """A descriptor of the file (or folder) at ``parts``, checked; closed on exit."""
        fd = self.open_fd(parts, directory)
        try:
            yield fd
        finally:
            os.close(fd)

    def open_fd(self, parts: Sequence[str], directory: bool = False) -> int:
        """A checked descriptor of the regular file (or folder) at ``parts``; the caller
        closes it."""
        for part in parts:
            check_name(part, "file name")
        where = self.where(parts)
        fd = -1
        try:
            if _AT:
                fd = os.open(self.path, _FLAGS | _DIRECTORY)
                for i, part in enumerate(parts):
                    last = i == len(parts) - 1
                    flags = _FLAGS | _NOFOLLOW | (_DIRECTORY if not last or directory else 0)
                    nxt = os.open(part, flags, dir_fd=fd)
                    os.close(fd)
                    fd = nxt
            else:  # pragma: no cover - no dir_fd (Windows): lstat each component instead
                for i in range(1, len(parts) + 1):
                    if stat.S_ISLNK(os.lstat(self.path.joinpath(*parts[:i])).st_mode):
                        raise OSError(errno.ELOOP, "a symlink")
                fd = os.open(where, _FLAGS)
            mode = os.fstat(fd).st_mode
        except FileNotFoundError:
            if fd >= 0:
                os.close(fd)
            raise
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise RunUnsafeError(
                    f"nbmonitor: {where} is a symlink or not a folder where one belongs; the "
                    "reader opens only regular files inside the run folder."
                ) from None
            if exc.errno == errno.EISDIR:
                raise RunUnsafeError(f"nbmonitor: {where} is a folder, not a file.") from None
            try:  # opening a socket fails with ENXIO: say what is there instead
                mode = os.lstat(where).st_mode
            except OSError:
                mode = stat.S_IFREG
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise RunUnsafeError(
                    f"nbmonitor: {where} is {_kind(mode)}, not a regular file; the reader "
                    "refuses to open it."
                ) from None
            raise _unreadable(where, exc) from None
        ok = stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)
        if not ok:
            os.close(fd)
            kind = _kind(mode)
            want = "a folder" if directory else "a regular file"
            raise RunUnsafeError(
                f"nbmonitor: {where} is {kind}, not {want}; the reader refuses to open it."
            )
        return fd

    def size(self, parts: Sequence[str]) -> int:
        """The size of a regular file (FileNotFoundError if missing)."""
        with self._open(parts) as fd:
            return os.fstat(fd).st_size

    def identity(self, parts: Sequence[str]) -> tuple[int, int, int, float]:
        """(device, inode, size, mtime) of a regular file: a tail tells a replaced file by it."""
        with self._open(parts) as fd:
            st = os.fstat(fd)
            return st.st_dev, st.st_ino, st.st_size, st.st_mtime

    def read(self, parts: Sequence[str], start: int = 0, limit: int | None = None) -> bytes:
        """At most ``limit`` bytes of the file from ``start`` (FileNotFoundError if missing)."""
        with self._open(parts) as fd:
            return read_fd(fd, start, limit, self.where(parts))

    def read_whole(self, parts: Sequence[str], limit: int) -> bytes:
        """The whole file; RunUnsafeError when it is larger than ``limit`` bytes."""
        with self._open(parts) as fd:
            size = os.fstat(fd).st_size
            data = read_fd(fd, 0, limit + 1, self.where(parts))
        if len(data) > limit or size > limit:
            raise RunUnsafeError(
                f"nbmonitor: {self.where(parts)} is larger than the reader's bound "
                f"({limit >> 20} MiB); not read."
            )
        return data

    @contextlib.contextmanager
    def opened(self, parts: Sequence[str]) -> Iterator[int]:
        """The checked descriptor of a regular file, for reads in several pieces."""
        with self._open(parts) as fd:
            yield fd

    def listdir(self, parts: Sequence[str] = ()) -> list[str]:
        """The names in a folder below the run folder ([] when it is missing)."""
        try:
            with self._open(parts, directory=True) as fd:
                return os.listdir(fd) if _AT else os.listdir(self.where(parts))
        except FileNotFoundError:
            return []

    def is_dir(self, parts: Sequence[str]) -> bool:
        """Whether ``parts`` is a real folder below the run folder (not a symlink to one)."""
        try:
            with self._open(parts, directory=True):
                return True
        except (FileNotFoundError, RunUnsafeError, RunUnreadableError):
            return False

    def is_file(self, parts: Sequence[str]) -> bool:
        """Whether ``parts`` is a regular file below the run folder (not a symlink)."""
        try:
            with self._open(parts):
                return True
        except (FileNotFoundError, RunUnsafeError, RunUnreadableError):
            return False


def _folder_or_raise(path: pathlib.Path) -> RunFolder:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise RunNotFoundError(
            f"nbmonitor: no run at '{path}' ({META} folder not found); {HINT}."
        ) from None
    except OSError as exc:  # a name too long, a folder it may not read, a loop of links
        reason = exc.strerror or type(exc).__name__
        raise RunNotFoundError(f"nbmonitor: no run at '{path}' ({reason}); {HINT}.") from None
    if not stat.S_ISDIR(mode):
        raise RunNotFoundError(f"nbmonitor: no run at '{path}' (not a folder); {HINT}.")
    return RunFolder(path)


def parse_json(data: bytes, where: object) -> object:
    """A whole JSON file (meta.json, a summary) by the reading contract's rules; one-line
    RunCorruptError saying what is wrong."""
    try:
        return loads_line(data)
    except ValueError as exc:
        raise RunCorruptError(f"nbmonitor: {where} is not valid JSON ({exc}).") from None


def read_meta(path: pathlib.Path) -> dict[str, Any]:
    """meta.json of the run at ``path``; RunNotFoundError (one line, with a hint) if none,
    RunCorruptError if it is damaged, not a regular file or past MAX_META_BYTES."""
    folder = _folder_or_raise(path)
    try:
        data = folder.read_whole([META], MAX_META_BYTES)
    except FileNotFoundError:
        raise RunNotFoundError(
            f"nbmonitor: no run at '{path}' ({META} not found); {HINT}."
        ) from None
    try:
        meta = loads_line(data)
    except ValueError as exc:
        raise RunCorruptError(
            f"nbmonitor: {path / META} is not valid JSON ({exc}); the run's metadata is damaged."
        ) from None
    return meta if isinstance(meta, dict) else {"meta": meta}


def read_fd(fd: int, start: int, limit: int | None, where: object) -> bytes:
    """Up to ``limit`` bytes from ``start`` of an open regular file, in pieces (a file that
    shrinks meanwhile just gives fewer bytes)."""
    size = os.fstat(fd).st_size
    want = max(0, size - start) if limit is None else max(0, min(limit, size - start))
    pieces: list[bytes] = []
    got = 0
    try:
        while got < want:
            piece = os.pread(fd, min(want - got, 64 << 20), start + got)
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
    except OSError as exc:
        raise _unreadable(where, exc) from None
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


__all__ = ["HINT", "RunFolder", "parse_json", "read_fd", "read_meta"]
