"""The columnar sidecar: a numeric stream's records again, as float64 chunks a reader loads
without parsing text.

``<run>/columns/<stream>/<seq>.npz`` (seq 000000, 000001, ...) holds ``names`` (the keys),
``data`` (one row per key, so each column is contiguous) and ``span`` = ``[start, end, rows]``:
the chunk is exactly the records on bytes ``[start, end)`` of the stream's JSON Lines file. The
JSON Lines stay the authoritative log; a reader trusts chunks only while their spans follow on
from each other from byte 0 and end inside the file, and parses the JSON Lines past the last one.
So a run killed before its next chunk (or still running) reads its last few thousand records
from text, and a chunk that is missing, damaged or ahead of the file is simply not used.

Each chunk is written once, to a temporary name, then ``os.replace``d: never seen half-written.
"""

from __future__ import annotations

import os
import pathlib
import re
import zipfile
from collections.abc import Mapping

import numpy as np

from nbmonitor.runs.decode import FloatArray, concat_columns

# A chunk is cut once the buffer holds this many values (rows x keys), so the JSON Lines a
# reader must parse past the last chunk stay small whatever the stream's width; see
# docs/performance.md ("Reading runs") for what that costs.
CHUNK_VALUES = 1 << 18

_CHUNK = re.compile(r"^(\d{6,})\.npz$")

Block = tuple[dict[str, FloatArray], int]


def chunk_paths(folder: pathlib.Path) -> list[pathlib.Path]:
    """The chunk files of one stream's sidecar folder, in order ([] if there is none)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = sorted((int(m[1]), n) for n in names if (m := _CHUNK.match(n)))
    return [folder / n for _, n in found]


def read_chunks(
    folder: pathlib.Path, file_size: int, *, spans_only: bool = False
) -> tuple[list[Block], int]:
    """The usable chunks of one stream, and the byte offset of the JSON Lines where they end.

    With ``spans_only`` the blocks carry no columns (counting rows without loading data).
    """
    blocks: list[Block] = []
    end = 0
    for path in chunk_paths(folder):
        try:
            # Our own handle: np.load leaks its file when the zip does not parse.
            with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
                start, stop, rows = (int(x) for x in z["span"])
                if start != end or stop > file_size or stop < start:
                    break
                cols: dict[str, FloatArray] = {}
                if not spans_only:
                    names, data = z["names"], z["data"]
                    if data.shape != (len(names), rows):
                        break
                    cols = {str(n): data[i] for i, n in enumerate(names)}
        # A damaged chunk: the text is read from here on.
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            break
        blocks.append((cols, rows))
        end = stop
    return blocks, end


def write_chunk(
    folder: pathlib.Path,
    seq: int,
    columns: Mapping[str, FloatArray],
    rows: int,
    span: tuple[int, int],
) -> None:
    """Write chunk ``seq`` atomically (creating the folder on first use)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = np.array(list(columns), dtype=str)
    if columns:
        data = np.stack([np.asarray(c, dtype=np.float64) for c in columns.values()])
    else:
        data = np.empty((0, rows))
    path = folder / f"{seq:06d}.npz"
    tmp = folder / f".{seq:06d}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, names=names, data=data, span=np.array([span[0], span[1], rows], np.int64))
    os.replace(tmp, path)


class ChunkBuffer:
    """The writer's side: records since the last chunk, as columns, with their byte span.

    ``add`` is called with each batch the writer appended (and its byte length); ``due`` says
    when a chunk should be cut; ``take`` empties the buffer into one chunk's worth.
    """

    def __init__(self, start: int = 0) -> None:
        self.start = start  # byte offset of the first buffered record
        self.end = start
        self.seq = 0
        self._blocks: list[Block] = []
        self._values = 0

    @property
    def rows(self) -> int:
        return sum(n for _, n in self._blocks)

    @property
    def due(self) -> bool:
        return self._values >= CHUNK_VALUES

    def add(self, columns: dict[str, FloatArray], rows: int, nbytes: int) -> None:
        """Buffer ``rows`` records (as :func:`~nbmonitor.runs.decode.to_columns` gives them)
        that took ``nbytes`` of the JSON Lines file."""
        self._blocks.append((columns, rows))
        self._values += rows * max(len(columns), 1)
        self.end += nbytes

    def take(self) -> tuple[dict[str, FloatArray], int, tuple[int, int]]:
        cols = concat_columns(self._blocks)
        rows, span = self.rows, (self.start, self.end)
        self._blocks, self._values = [], 0
        self.start = self.end
        return cols, rows, span
