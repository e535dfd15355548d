"""The columnar sidecar: a numeric stream's records again, as float64 chunks a reader loads
without parsing text.

``<run>/columns/<stream>/<seq>.npz`` (seq 000000, 000001, ...) holds ``keys`` (the keys, a
UTF-8 JSON list), ``dense`` and ``data`` (the keys present in at least half the rows, one row
of ``data`` each), ``sparse_ptr``/``sparse_rows``/``sparse_values`` (the other keys: only their
values, with their row numbers) and ``span`` = ``[start, end, rows]``: the chunk is exactly the
records on bytes ``[start, end)`` of the stream's JSON Lines file. Chunks written before sparse
keys (``names`` and ``data``, every key dense) still read.

The JSON Lines stay the authoritative log and the chunk is untrusted input like the rest: a
reader uses a chunk only while its span follows on from the last one's and ends inside the file
on a line end, its arrays have the dtypes and shapes their rows need and no more bytes than its
span can index, nothing in it is compressed, and its first and last rows equal the first and
last lines of its span, value for value. At the first chunk that fails it parses the JSON Lines
from there. So a run killed before its next chunk (or still running) reads its last few
thousand records from text, and a chunk that is missing, damaged, lying or ahead of the file is
simply not used.

Each chunk is written once, to a temporary name, then ``os.replace``d: never seen half-written.
"""

from __future__ import annotations

import io
import json
import math
import pathlib
import re
import zipfile
import zlib
from collections.abc import Sequence

import numpy as np

from nbmonitor._atomic import atomic_path
from nbmonitor.runs.decode import Columns, concat_columns, loads_line, to_columns
from nbmonitor.runs.files import RunFolder
from nbmonitor.runs.format import RunDirError

# A chunk is cut once the buffer holds this many values (rows x keys), so the JSON Lines a
# reader must parse past the last chunk stay small whatever the stream's width; see
# benchmarks/NOTES.md ("Reading runs") for what that costs.
CHUNK_VALUES = 1 << 18
# The reading contract's bound on a chunk: its arrays may hold at most this many bytes per
# byte of the JSON Lines it indexes (an honest chunk holds 8 bytes per dense value, 16 per
# sparse one, and each value takes at least 5 bytes of text), plus a little for names.
BYTES_PER_TEXT_BYTE = 4
SLACK_BYTES = 1 << 20
# ... and never more than this in all, whatever the text.
MAX_CHUNK_BYTES = 1 << 30
# The shortest line that holds a record: "{}\n".
MIN_LINE = 3

_CHUNK = re.compile(r"^(\d{6,})\.npz$")
# Arrays of a chunk and the dtypes they must have (format 2: sparse keys; format 1: dense).
_V2 = {
    "span": "<i8",
    "keys": "|u1",
    "dense": "<i8",
    "data": "<f8",
    "sparse_ptr": "<i8",
    "sparse_rows": "<i8",
    "sparse_values": "<f8",
}
_V1 = {"span": "<i8", "names": "<U", "data": "<f8"}


class ChunkRejected(ValueError):
    """A chunk the reader does not trust (the reason is the message); the text is read."""


def chunk_names(sidecar: RunFolder, parts: Sequence[str]) -> list[str]:
    """The chunk files of one stream's sidecar folder, in order ([] if there is none)."""
    try:
        names = sidecar.listdir(parts)
    except RunDirError:
        return []
    found = sorted((int(m[1]), n) for n in names if (m := _CHUNK.match(n)))
    return [n for _, n in found]


def read_chunks(
    folder: RunFolder,
    parts: Sequence[str],
    stream_parts: Sequence[str],
    file_size: int,
    *,
    spans_only: bool = False,
) -> tuple[list[Columns], int]:
    """The usable chunks of one stream, and the byte offset of the JSON Lines where they end.

    ``parts``: the stream's sidecar folder inside the run folder ``folder``;
    ``stream_parts``: its JSON Lines file. A chunk is used only while it agrees with the text
    (module docstring); at the first that does not, the text is read from there on. With
    ``spans_only`` the blocks carry no columns (counting rows without loading data).
    """
    blocks: list[Columns] = []
    end = 0
    for name in chunk_names(folder, parts):
        try:
            block, stop = load_chunk(folder, [*parts, name], stream_parts, end, file_size,
                                     spans_only=spans_only)  # fmt: skip
        except (ChunkRejected, RunDirError, FileNotFoundError):
            break
        blocks.append(block)
        end = stop
    return blocks, end


def _arrays(raw: bytes, bound: int) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` whose members are stored (no compression), each checked
    against its header before anything is allocated: dtype, shape, byte size, ``bound``."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(raw))
        infos = zf.infolist()
    except Exception as exc:  # a hostile zip: zipfile raises many kinds (even NotImplemented)
        raise ChunkRejected(f"not a zip file ({type(exc).__name__})") from None
    if sum(i.file_size for i in infos) > bound:
        raise ChunkRejected("its arrays are larger than the text they index allows")
    out: dict[str, np.ndarray] = {}
    view = memoryview(raw)
    for info in infos:
        name = info.filename.removesuffix(".npy")
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise ChunkRejected(f"{info.filename} is compressed")
        # The member's bytes where they lie in the file (no copy): after its local header.
        at = info.header_offset
        head = raw[at : at + 30]
        if len(head) != 30 or head[:4] != b"PK\x03\x04":
            raise ChunkRejected(f"{info.filename}: no local header")
        start = (
            at + 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little")
        )
        data = view[start : start + info.file_size]
        if len(data) != info.file_size or zlib.crc32(data) != info.CRC:
            raise ChunkRejected(f"{info.filename}: damaged (CRC-32)")
        try:
            f = io.BytesIO(data[: min(len(data), 1 << 16)])
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"npy version {version}")
        except Exception as exc:  # a hostile member: numpy raises many kinds
            raise ChunkRejected(f"{info.filename}: {type(exc).__name__}") from None
        if fortran or dtype.hasobject or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ChunkRejected(f"{info.filename}: not a plain array")
        count = math.prod(shape)
        offset = f.tell()
        if count * dtype.itemsize != len(data) - offset:
            raise ChunkRejected(f"{info.filename}: its header does not match its size")
        out[name] = np.frombuffer(raw, dtype=dtype, count=count, offset=start + offset).reshape(
            shape
        )
    return out


def _dtype_ok(arrays: dict[str, np.ndarray], want: dict[str, str]) -> bool:
    if set(arrays) != set(want):
        return False
    for name, code in want.items():
        got = arrays[name].dtype.str
        if not (got.startswith(code) if code == "<U" else got == code):
            return False
    return True


def load_chunk(
    folder: RunFolder,
    parts: Sequence[str],
    stream_parts: Sequence[str],
    start: int,
    file_size: int,
    *,
    spans_only: bool = False,
) -> tuple[Columns, int]:
    """One chunk, checked against the stream it indexes; (its columns, the byte where its
    span ends). ChunkRejected (saying why) when it does not agree."""
    size = folder.size(parts)
    bound = min(MAX_CHUNK_BYTES, BYTES_PER_TEXT_BYTE * max(0, file_size - start) + SLACK_BYTES)
    if size > bound + SLACK_BYTES:
        raise ChunkRejected("larger than the text it indexes allows")
    arrays = _arrays(folder.read(parts, 0, size), bound)
    span = arrays.get("span")
    if span is None or span.shape != (3,) or span.dtype.str != "<i8":
        raise ChunkRejected("no span")
    first, stop, rows = (int(x) for x in span)
    if first != start or not (start <= stop <= file_size) or rows < 0:
        raise ChunkRejected("its span does not follow on or lies outside the text")
    if rows * MIN_LINE > stop - start or (rows == 0) != (stop == start):
        raise ChunkRejected(f"{rows} rows cannot fit in {stop - start} bytes")
    # Arrays beyond the span's own allowance: a chunk lying about its text.
    allowed = BYTES_PER_TEXT_BYTE * (stop - start) + SLACK_BYTES
    if sum(a.nbytes for a in arrays.values()) > allowed:
        raise ChunkRejected("its arrays are larger than its span allows")
    if "keys" in arrays:
        if not _dtype_ok(arrays, _V2):
            raise ChunkRejected("unexpected arrays or dtypes")
        columns = _columns_v2(arrays, rows)
    else:
        if not _dtype_ok(arrays, _V1):
            raise ChunkRejected("unexpected arrays or dtypes")
        names = [str(n) for n in arrays["names"]]
        data = arrays["data"]
        if arrays["names"].ndim != 1 or data.shape != (len(names), rows):
            raise ChunkRejected("data does not have one row per name")
        if len(set(names)) != len(names):
            raise ChunkRejected("a key twice")
        columns = Columns(rows, dict(zip(names, data, strict=True)))
    if rows:
        _agrees(folder, stream_parts, columns, start, stop)
    return (Columns(rows) if spans_only else columns), stop


def _columns_v2(arrays: dict[str, np.ndarray], rows: int) -> Columns:
    try:
        keys = json.loads(arrays["keys"].tobytes().decode("utf-8"))
    except (ValueError, RecursionError):
        raise ChunkRejected("keys are not a JSON list") from None
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        raise ChunkRejected("keys are not a JSON list of strings")
    if len(set(keys)) != len(keys):
        raise ChunkRejected("a key twice")
    dense_at, data = arrays["dense"], arrays["data"]
    ptr, where, values = arrays["sparse_ptr"], arrays["sparse_rows"], arrays["sparse_values"]
    n_dense = len(dense_at)
    n_sparse = len(keys) - n_dense
    if (
        dense_at.ndim != 1
        or data.shape != (n_dense, rows)
        or n_sparse < 0
        or ptr.shape != (n_sparse + 1,)
        or where.ndim != 1
        or values.shape != where.shape
    ):
        raise ChunkRejected("array shapes disagree")
    if n_dense and (dense_at.min() < 0 or dense_at.max() >= len(keys)):
        raise ChunkRejected("dense key index out of range")
    if len(set(dense_at.tolist())) != n_dense:
        raise ChunkRejected("dense key index twice")
    if ptr[0] != 0 or ptr[-1] != len(where) or (np.diff(ptr) < 0).any():
        raise ChunkRejected("sparse pointers do not cover the values")
    if len(where) and (where.min() < 0 or where.max() >= rows):
        raise ChunkRejected("sparse row index out of range")
    dense_set = set(dense_at.tolist())
    dense = {keys[int(i)]: data[j] for j, i in enumerate(dense_at)}
    sparse_keys = [k for i, k in enumerate(keys) if i not in dense_set]
    sparse = {
        k: (where[ptr[j] : ptr[j + 1]], values[ptr[j] : ptr[j + 1]])
        for j, k in enumerate(sparse_keys)
    }
    return Columns(rows, dense, sparse, list(keys))


def _line_at(folder: RunFolder, parts: Sequence[str], start: int, stop: int, last: bool) -> bytes:
    """The first (or last) line of bytes [start, stop) of the stream, read in growing
    windows (at most the span)."""
    window = 4096
    while True:
        window = min(window, stop - start)
        at = stop - window if last else start
        data = folder.read(parts, at, window)
        if len(data) != window:
            raise ChunkRejected("the text is shorter than the span")
        body = data[:-1] if last else data
        cut = body.rfind(b"\n") if last else body.find(b"\n")
        if cut >= 0:
            return body[cut + 1 :] if last else body[:cut]
        if window == stop - start:
            return body
        window *= 16


def _agrees(
    folder: RunFolder, parts: Sequence[str], columns: Columns, start: int, stop: int
) -> None:
    """The chunk's first and last rows must be the first and last lines of its span, value for
    value (bit for bit), and the span must be whole lines."""
    if folder.read(parts, stop - 1, 1) != b"\n" or (
        start and folder.read(parts, start - 1, 1) != b"\n"
    ):
        raise ChunkRejected("its span does not cover whole lines")
    for row, last in ((0, False), (columns.rows - 1, True)):
        line = _line_at(folder, parts, start, stop, last)
        try:
            record = loads_line(line)
        except ValueError:
            raise ChunkRejected("a line of its span is not JSON") from None
        if not isinstance(record, dict):
            raise ChunkRejected("a line of its span is not a record")
        want = to_columns([record])
        present = [k for k in columns if not math.isnan(_value(columns, k, row))]
        for key in {*want, *present}:
            got = _value(columns, key, row) if key in columns else math.nan
            expect = float(want[key][0]) if key in want else math.nan
            if np.float64(got).tobytes() != np.float64(expect).tobytes() and not (
                math.isnan(got) and math.isnan(expect)
            ):
                raise ChunkRejected(f"row {row} disagrees with the text at {key!r}")


def _value(columns: Columns, key: str, row: int) -> float:
    col = columns.dense.get(key)
    if col is not None:
        return float(col[row])
    idx, values = columns.sparse[key]
    at = int(np.searchsorted(idx, row))
    return float(values[at]) if at < len(idx) and idx[at] == row else math.nan


def write_chunk(
    folder: pathlib.Path, seq: int, blocks: Sequence[Columns], span: tuple[int, int]
) -> None:
    """Write chunk ``seq`` (format 2: dense and sparse keys) atomically, creating the folder
    on first use: the rows of ``blocks`` one after the other, as ``concat_columns(blocks)``.

    The npz is written straight into its file, the dense values' bytes as they lie: no copy
    of them as bytes, none of the whole file in memory; blocks that all hold the same keys,
    none sparse (a stream whose keys do not change), fill one ``(keys, rows)`` matrix without
    being concatenated per key first. A chunk is ~2 MiB cut in one tick on the writer's thread, and
    every copy of it held the GIL the training thread needs (benchmarks/NOTES.md, "The run
    log's worker per row")."""
    folder.mkdir(parents=True, exist_ok=True)
    first = blocks[0] if blocks else Columns(0)
    dense: list[np.ndarray]
    if all(not b.sparse and b.order == first.order for b in blocks) and first.rows:
        keys = list(first.order)
        dense_at = list(range(len(keys)))
        rows = sum(b.rows for b in blocks)
        # One (keys, rows) matrix filled block by block: one allocation, one write.
        data = np.empty((len(keys), rows))
        at = 0
        for b in blocks:
            for j, key in enumerate(keys):
                data[j, at : at + b.rows] = b.dense[key]
            at += b.rows
        dense = [data]
        sparse: list[tuple[np.ndarray, np.ndarray]] = []
    else:
        columns = concat_columns(blocks)
        keys = list(columns)
        dense_at = [i for i, k in enumerate(keys) if k in columns.dense]
        dense = [columns.dense[keys[i]] for i in dense_at]
        sparse = [columns.sparse[k] for k in keys if k in columns.sparse]
        rows = columns.rows
    lengths = [len(idx) for idx, _ in sparse]
    small: dict[str, np.ndarray] = {
        "span": np.array([span[0], span[1], rows], np.int64),
        "keys": np.frombuffer(json.dumps(keys).encode(), dtype=np.uint8),
        "dense": np.array(dense_at, np.int64),
    }
    tail: dict[str, np.ndarray] = {
        "sparse_ptr": np.cumsum([0, *lengths], dtype=np.int64),
        "sparse_rows": np.concatenate([idx for idx, _ in sparse]).astype(np.int64)
        if sparse
        else np.empty(0, np.int64),
        "sparse_values": np.concatenate([v for _, v in sparse]).astype(np.float64)
        if sparse
        else np.empty(0),
    }
    with (
        atomic_path(folder / f"{seq:06d}.npz") as tmp,
        zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf,
    ):
        for name, array in small.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array, allow_pickle=False)
        with zf.open("data.npy", "w", force_zip64=True) as f:
            header = {"descr": "<f8", "fortran_order": False, "shape": (len(dense_at), rows)}
            np.lib.format.write_array_header_1_0(f, header)
            for part in dense:  # the keys' rows one after the other: C order
                f.write(np.ascontiguousarray(part, dtype=np.float64).data)
        for name, array in tail.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array, allow_pickle=False)


class ChunkBuffer:
    """The writer's side: records since the last chunk, as columns, with their byte span.

    ``add`` is called with each batch the writer appended (and its byte length); ``due`` says
    when a chunk should be cut; ``take`` empties the buffer into one chunk's worth.
    """

    def __init__(self, start: int = 0) -> None:
        self.start = start  # byte offset of the first buffered record
        self.end = start
        self.seq = 0
        self._blocks: list[Columns] = []
        self._values = 0

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self._blocks)

    @property
    def due(self) -> bool:
        return self._values >= CHUNK_VALUES

    def add(self, columns: Columns, nbytes: int) -> None:
        """Buffer the records of ``columns`` (as :func:`~nbmonitor.runs.decode.to_columns`
        gives them) that took ``nbytes`` of the JSON Lines file."""
        self._blocks.append(columns)
        self._values += max(1, columns.nbytes // 8)
        self.end += nbytes

    def take(self) -> tuple[list[Columns], tuple[int, int]]:
        """The buffered blocks (for :func:`write_chunk`) and their byte span; the buffer
        starts again after them."""
        blocks, span = self._blocks, (self.start, self.end)
        self._blocks, self._values = [], 0
        self.start = self.end
        return blocks, span
