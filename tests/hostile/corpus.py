"""A corpus of hostile and malformed run folders, each built by a function of its own.

Every builder makes one run folder (or a folder of runs) under ``root`` and returns what the
reading side must then do with it (:class:`Expect`); ``harness.py`` builds each case in a
subprocess with a memory cap and a timeout and runs every reading operation on it. Builders
only use the stdlib and numpy (they run where torch may be absent).
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import socket
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# A value planted outside a run folder: it must never come back from reading the run.
OUTSIDE = 424242.5


@dataclass
class Expect:
    """What reading the case must give (besides never a hang, a blow-up or a bare error)."""

    open_error: str | None = None  # the RunDirError subclass open() raises, if any
    steps: list[float] | None = None  # history()["step"], exactly
    warn: str | None = None  # a substring of some RunDataWarning raised by history()/events()
    events: int | None = None  # how many events read back
    spans: int | None = None
    listed: int | None = None  # rows list_runs(root) gives
    unreadable: int | None = None  # of which "unreadable (...)"
    extra: list[Callable[[pathlib.Path], list[str]]] = field(default_factory=list)


def meta(path: pathlib.Path, **fields: object) -> None:
    path.mkdir(parents=True, exist_ok=True)
    base = {"format_version": 1, "name": path.name, "status": "closed", "steps": 3}
    base.update(fields)
    (path / "meta.json").write_text(json.dumps(base))


def lines(records: list[object]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def good_steps(n: int = 3) -> bytes:
    return lines([{"step": float(i), "time": 1.7e9 + i, "loss": 1.0 / (i + 1)} for i in range(n)])


def plain(root: pathlib.Path, name: str = "run", n: int = 3, **fields: object) -> pathlib.Path:
    path = root / name
    meta(path, **fields)
    (path / "steps.jsonl").write_bytes(good_steps(n))
    return path


def outside(root: pathlib.Path) -> pathlib.Path:
    """A folder beside the runs with data that must never be read through a run."""
    other = root.parent / "outside"
    other.mkdir(exist_ok=True)
    (other / "steps.jsonl").write_bytes(lines([{"step": 0.0, "loss": OUTSIDE}]))
    (other / "meta.json").write_text(json.dumps({"format_version": 1}))
    write_chunk_v1(other / "steps" / "000000.npz", ["step", "loss"], np.array([[0.0], [OUTSIDE]]),
                   (0, 10**6, 1))  # fmt: skip
    return other


def npz(arrays: dict[str, np.ndarray], compressed: bool = False) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def write_chunk_v1(
    path: pathlib.Path, names: list[str], data: np.ndarray, span: tuple[int, int, int]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(npz({"names": np.array(names), "data": data, "span": np.array(span)}))


def npy_lying(shape: tuple[int, ...], body: bytes, dtype: str = "<f8") -> bytes:
    header = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + body


# -- special files ---------------------------------------------------------------------------


def meta_fifo(root: pathlib.Path) -> Expect:
    path = root / "run"
    path.mkdir(parents=True)
    os.mkfifo(path / "meta.json")
    return Expect(open_error="RunUnsafeError", listed=1, unreadable=1)


def steps_fifo(root: pathlib.Path) -> Expect:
    path = root / "run"
    meta(path)
    for name in ("steps.jsonl", "system.jsonl", "events.jsonl", "spans.jsonl", "layers.jsonl"):
        os.mkfifo(path / name)
    return Expect(steps=[], warn="FIFO", listed=1)


def meta_dev_zero(root: pathlib.Path) -> Expect:
    path = root / "run"
    path.mkdir(parents=True)
    os.symlink("/dev/zero", path / "meta.json")
    return Expect(open_error="RunUnsafeError", listed=1, unreadable=1)


def steps_dev_zero(root: pathlib.Path) -> Expect:
    path = root / "run"
    meta(path)
    os.symlink("/dev/zero", path / "steps.jsonl")
    os.symlink("/dev/urandom", path / "events.jsonl")
    return Expect(steps=[], warn="symlink", listed=1)


def steps_socket(root: pathlib.Path) -> Expect:
    path = root / "run"
    meta(path)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path / "steps.jsonl"))  # stays bound until the harness process ends
    _KEEP.append(sock)
    return Expect(steps=[], warn="socket", listed=1)


_KEEP: list[object] = []


def streams_are_folders(root: pathlib.Path) -> Expect:
    path = root / "run"
    meta(path)
    (path / "steps.jsonl").mkdir()
    (path / "events.jsonl").mkdir()
    (path / "system.jsonl").write_bytes(lines([{"step": 1.0, "cpu_percent": 5.0}]))
    return Expect(steps=[], warn="folder", listed=1)


def meta_is_a_folder(root: pathlib.Path) -> Expect:
    (root / "run" / "meta.json").mkdir(parents=True)
    return Expect(open_error="RunUnsafeError", listed=1, unreadable=1)


def chunk_fifo(root: pathlib.Path) -> Expect:
    path = plain(root, sidecar="columns")
    (path / "columns" / "steps").mkdir(parents=True)
    os.mkfifo(path / "columns" / "steps" / "000000.npz")
    return Expect(steps=[0.0, 1.0, 2.0], listed=1)


def run_folder_symlink_in_runs(root: pathlib.Path) -> Expect:
    other = outside(root)
    root.mkdir(parents=True, exist_ok=True)
    os.symlink(other, root / "link")
    plain(root, "real")
    return Expect(listed=1)


# -- escapes out of the folder --------------------------------------------------------------


def files_escape(root: pathlib.Path) -> Expect:
    other = outside(root)
    plain(root, "a", files={"steps": "../../outside/steps.jsonl"})
    plain(root, "b", files={"steps": str(other / "steps.jsonl")})
    plain(root, "c", files={"steps": "sub/steps.jsonl"})
    plain(root, "d", files={"steps": ""})
    plain(root, "e", files={"steps": ".."})
    plain(root, "f", files={"steps": "a\u0000b"})
    plain(root, "g", files={"steps": 5, "events": ["x"]})
    plain(root, "h", files="steps.jsonl")
    return Expect(listed=8, extra=[_never_outside])


def sidecar_escape(root: pathlib.Path) -> Expect:
    other = outside(root)
    plain(root, "run", sidecar="../../outside")
    plain(root, "abs", sidecar=str(other))
    plain(root, "odd", sidecar=7)
    return Expect(listed=3, extra=[_never_outside])


def symlinked_streams(root: pathlib.Path) -> Expect:
    other = outside(root)
    path = root / "run"
    meta(path, sidecar="columns")
    os.symlink(other / "steps.jsonl", path / "steps.jsonl")
    os.symlink(other, path / "columns")
    return Expect(steps=[], warn="symlink", listed=1, extra=[_never_outside])


def symlinked_rank(root: pathlib.Path) -> Expect:
    other = outside(root)
    job = root / "job"
    meta(job, layout="ranks", world_size=3)
    plain(job, "rank0")
    os.symlink(other, job / "rank1")
    plain(job, "rank²")  # not a rank: "²".isdigit() is True, int("²") raises
    return Expect(listed=1, extra=[_never_outside])


def _never_outside(root: pathlib.Path) -> list[str]:
    """No reading operation on any run under ``root`` returns the value planted outside."""
    from nbmonitor.runs import open_run
    from nbmonitor.runs.format import RunDirError

    problems = []
    for path in sorted(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()):
        try:
            run = open_run(path)
            cols = run.history()
        except RunDirError:
            continue
        if any(OUTSIDE in np.asarray(cols[k]) for k in cols):
            problems.append(f"{path.name}: read data from outside the run folder")
    return problems


# -- huge and lying sizes --------------------------------------------------------------------


def chunk_lies_about_rows(root: pathlib.Path) -> Expect:
    path = plain(root, sidecar="columns")
    size = (path / "steps.jsonl").stat().st_size
    # 200 million rows claimed by a small, compressed chunk.
    rows = 200_000_000
    arrays = {"names": np.array(["step"]), "data": np.zeros((1, rows // 100)),
              "span": np.array([0, size, rows])}  # fmt: skip
    (path / "columns" / "steps").mkdir(parents=True)
    (path / "columns" / "steps" / "000000.npz").write_bytes(npz(arrays, compressed=True))
    return Expect(steps=[0.0, 1.0, 2.0], listed=1)


def chunk_header_claims_a_trillion(root: pathlib.Path) -> Expect:
    path = plain(root, sidecar="columns")
    size = (path / "steps.jsonl").stat().st_size
    folder = path / "columns" / "steps"
    folder.mkdir(parents=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("names.npy", npy_lying((1,), b"s\x00\x00\x00", "<U1"))
        z.writestr("data.npy", npy_lying((1, 10**12), b"\x00" * 24))
        z.writestr("span.npy", npy_lying((3,), np.array([0, size, 10**12]).tobytes(), "<i8"))
    (folder / "000000.npz").write_bytes(buf.getvalue())
    # A second sidecar stream whose chunk is not a zip at all, one that is a zip of an object.
    (path / "columns" / "system").mkdir()
    (path / "columns" / "system" / "000000.npz").write_bytes(b"PK\x03\x04" + b"\xff" * 100)
    return Expect(steps=[0.0, 1.0, 2.0], listed=1)


def chunk_values_disagree(root: pathlib.Path) -> Expect:
    path = plain(root, sidecar="columns")
    size = (path / "steps.jsonl").stat().st_size
    write_chunk_v1(path / "columns" / "steps" / "000000.npz", ["step", "loss"],
                   np.array([[0.0, 1.0, 2.0], [OUTSIDE] * 3]), (0, size, 3))  # fmt: skip
    return Expect(steps=[0.0, 1.0, 2.0], listed=1, extra=[_never_outside])


def chunk_of_objects(root: pathlib.Path) -> Expect:
    path = plain(root, sidecar="columns")
    size = (path / "steps.jsonl").stat().st_size
    folder = path / "columns" / "steps"
    folder.mkdir(parents=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("names.npy", npy_lying((2,), b"", "|O"))
        z.writestr("data.npy", npy_lying((2, 3), b"\x00" * 48))
        z.writestr("span.npy", npy_lying((3,), np.array([0, size, 3]).tobytes(), "<i8"))
    (folder / "000000.npz").write_bytes(buf.getvalue())
    return Expect(steps=[0.0, 1.0, 2.0], listed=1)


def long_lines(root: pathlib.Path) -> Expect:
    path = root / "run"
    meta(path)
    big = b'{"step": 1.0, "x": "' + b"y" * (6 << 20) + b'"}\n'
    (path / "steps.jsonl").write_bytes(good_steps(1) + big + lines([{"step": 2.0}]))
    # A torn last line hundreds of MiB long (a hole: no disk), never held whole.
    with open(path / "events.jsonl", "wb") as f:
        f.write(
            lines([{"time": 1.0, "rule": "r", "message": "ok"}]) + b'{"time": 2.0, "message": "'
        )
        f.truncate(300 << 20)
    return Expect(steps=[0.0, 2.0], warn="longer than", events=1, listed=1)


def huge_meta(root: pathlib.Path) -> Expect:
    path = root / "run"
    path.mkdir(parents=True)
    with open(path / "meta.json", "wb") as f:
        f.write(b'{"pad": "')
        f.truncate(200 << 20)
    return Expect(open_error="RunUnsafeError", listed=1, unreadable=1)


# -- broken JSON of every kind ---------------------------------------------------------------


def broken_lines(root: pathlib.Path) -> Expect:
    path = root / "run"
    meta(path)
    body = b"".join([
        b'{"step": 0.0}\n',
        b'{"step": 1.0, "a": [1\n',  # two half-lines that a comma-joined block parse accepts
        b'2]}, {"step": 99.0}\n',
        b"\n   \n",
        b"[1, 2]\n", b'"text"\n', b"42\n", b"null\n", b"true\n",
        b'{"step": 2.0}\r\n',
        b'{"step": Infinity}\n', b'{"step": NaN}\n', b'{"step": "3"}\n', b'{"step": 1e400}\n',
        b'{"step": 3.5}\n', b'{"step": true}\n', b'{"step": ' + b"9" * 5000 + b"}\n",
        b'{"step": 3.0, "big": ' + b"9" * 400 + b', "inf": Infinity, "s": "NaN", "o": {}}\n',
        b'{"step": 4.0, "step": 5.0}\n',
        b"\xff\xfe{}\n", b'{"step": 6.0, "k\xc3": 1}\n', b'{"step": 7.0, "\\ud800": 1.0}\n',
        b"\x00\x00\x00\n", b"{" * 5 + b"\n",
        b'{"step": 8.0}',  # torn
    ])  # fmt: skip
    (path / "steps.jsonl").write_bytes(body)
    events = [
        {"time": 1.0, "message": "fine", "rule": "loss", "layers": ["a"]},
        {"time": "soon", "message": "x"},
        {"time": 1.0, "message": {"nested": 1}},
        {"time": 1.0, "layers": "a,b"},
        {"time": 1.0, "step": 1e300},
        {"time": float("inf")},
        {"message": "no time", "rule": "r"},
        {"time": 1.0, "message": "no rule"},  # not an alert: events() skips it, with a warning
    ]
    (path / "events.jsonl").write_bytes(lines(events).replace(b"Infinity", b"Infinity"))
    spans = [
        {"name": "data", "step": 1, "start": 1.0, "dur": 0.1, "depth": 0, "thread": 0},
        {"name": 5, "step": 1, "start": 1.0, "dur": 0.1},
        {"name": "x", "step": "one", "start": 1.0, "dur": 0.1},
        {"name": "x", "step": 1, "start": None, "dur": 0.1},
        {"name": "x", "step": 1, "start": 1.0, "dur": float("nan")},
        {"name": "x", "step": 1, "start": 1.0, "dur": 0.1, "thread": [1]},
    ]
    (path / "spans.jsonl").write_bytes(lines(spans))
    return Expect(steps=[0.0, 2.0, 3.0, 5.0, 7.0], warn="line 2", events=2, spans=1,
                  listed=1)  # fmt: skip


def deep_nesting(root: pathlib.Path) -> Expect:
    path = root / "run"
    meta(path)
    deep = b'{"step": 1.0, "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n"
    deep_obj = b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"\n"
    (path / "steps.jsonl").write_bytes(good_steps(1) + deep + deep_obj + lines([{"step": 2.0}]))
    (path / "events.jsonl").write_bytes(deep_obj + lines([{"time": 1.0, "rule": "r"}]))
    nested = root / "nested_meta"
    nested.mkdir()
    (nested / "meta.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    return Expect(steps=[0.0, 2.0], warn="nested deeper", events=1, listed=2, unreadable=1)


def bad_meta(root: pathlib.Path) -> Expect:
    root.mkdir(parents=True)
    for name, text in {
        "not_json": b"{",
        "array": b"[1, 2]",
        "utf16": '{"a": 1}'.encode("utf-16"),
        "latin1": b'{"name": "\xe9"}',
        "empty": b"",
        "nan": b'{"pid": NaN, "start_timestamp": Infinity, "steps": 1e300}',
        "bigint": b'{"pid": ' + b"9" * 5000 + b"}",
    }.items():
        (root / name).mkdir()
        (root / name / "meta.json").write_bytes(text)
    plain(root, "types", pid="x", host=5, start_timestamp="yesterday", start_time={"a": [1]},
          status=["closed"], steps=-1, backend={"name": {"x": 1}}, end_time=0,
          format_version="one", sidecar=3, layout=None)  # fmt: skip
    plain(root, "huge_numbers", pid=2**80, start_timestamp=1e308, steps=10**30, host="h")
    here = socket.gethostname()
    plain(root, "huge_pid_here", pid=2**80, status=None, steps=None, host=here)
    plain(root, "bool_pid_here", pid=True, status=None, steps=None, host=here)
    plain(root, "negative_pid_here", pid=-1, status=None, steps=None, host=here,
          start_timestamp=float("inf"))  # fmt: skip
    job = root / "job_with_a_bad_rank"
    meta(job, layout="ranks", world_size=2)
    plain(job, "rank0")
    (job / "rank1").mkdir()
    (job / "rank1" / "meta.json").write_bytes(b"[" * 10_000)
    return Expect(listed=13)


# -- hostile names and texts -----------------------------------------------------------------

INF, NINF, NAN = float("inf"), float("-inf"), float("nan")
NON_FINITE = [1.0, INF, NINF, NAN, 2.0, INF]


def non_finite_values(root: pathlib.Path) -> Expect:
    """±Infinity (also written as numbers past float64, ``1e999``) and NaN in every metric
    of every numeric stream, in the keys nbmonitor derives from (step_time, throughput,
    energy, memory, phases), and in a step's ``time``: read back as data (docs/file-format.md,
    "Non-finite numbers"), drawn, listed, compared and exported without an error."""
    path = root / "run"
    meta(path, steps=7, attach={"total_steps": 10}, backend={"name": "cpu"})
    keys = ("loss", "grad_norm", "grad_norm_clipped", "step_time", "samples_per_s",
            "tokens_per_s", "lr", "phase_data_s", "phase_forward_s", "update_ratio/w",
            "grad_norm/w", "param_norm/w", "samples", "tokens", "best_loss")  # fmt: skip
    rows = [
        {"step": float(i + 1), "time": INF if i == 2 else 1.7e9 + i, **dict.fromkeys(keys, v)}
        for i, v in enumerate(NON_FINITE)
    ]
    text = lines(rows) + b'{"step": 7.0, "loss": 1e999, "grad_norm": -1e400, "time": 1e999}\n'
    (path / "steps.jsonl").write_bytes(text)
    system = ("cpu_percent", "process_rss_bytes", "gpu0_util", "gpu0_mem_used_bytes",
              "gpu0_mem_total_bytes", "gpu0_power_w", "gpu0_energy_j", "mem_used_bytes",
              "mem_total_bytes")  # fmt: skip
    (path / "system.jsonl").write_bytes(lines([
        {"time": 1.7e9 + i, "step": float(i + 1), **dict.fromkeys(system, v)}
        for i, v in enumerate(NON_FINITE)
    ]))  # fmt: skip
    (path / "layers.jsonl").write_bytes(lines([
        {"step": float(i + 1), "grad_norm/w": v, "update_ratio/w": v, "param_norm/w": v}
        for i, v in enumerate(NON_FINITE)
    ]))  # fmt: skip
    return Expect(steps=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], listed=1, extra=[_non_finite_kept])


def _non_finite_kept(root: pathlib.Path) -> list[str]:
    from nbmonitor.runs import open_run

    run = open_run(root / "run")
    want = np.array([*NON_FINITE, INF])
    problems = []
    for stream, key in (("steps", "loss"), ("system", "cpu_percent"), ("layers", "grad_norm/w")):
        got = run.columns(stream)[key]
        expect = want if stream == "steps" else want[:-1]
        if got.tobytes() != expect.tobytes():
            problems.append(f"{stream} {key} read as {got.tolist()}, written {expect.tolist()}")
    if run.history()["grad_norm"][-1] != NINF:
        problems.append("-1e400 did not read as -Infinity")
    return problems


def huge_numbers_in_meta(root: pathlib.Path) -> Expect:
    """Integers past what a float64 holds (400 digits) wherever meta.json has a number: a
    step count, a planned total, a pid, a start time, a world size. Any sum or ratio with one
    would raise OverflowError; they read as no number at all."""
    path = root / "run"
    path.mkdir(parents=True)
    big = "1" + "0" * 400
    fields = ("steps", "pid", "start_timestamp", "world_size", "interval", "format_version")
    text = "{" + ", ".join(f'"{k}": {big}' for k in fields)
    text += f', "attach": {{"total_steps": {big}}}, "host": "{socket.gethostname()}"}}'
    (path / "meta.json").write_text(text)
    (path / "steps.jsonl").write_bytes(good_steps(3))
    job = root / "job"
    meta(job, layout="ranks", world_size=0)
    (job / "meta.json").write_text(text.replace('"steps"', '"layout": "ranks", "x"'))
    meta(job / "rank0")
    (job / "rank0" / "steps.jsonl").write_bytes(good_steps(2))
    return Expect(steps=[0.0, 1.0, 2.0], listed=2, unreadable=0, extra=[_watched])


def param_types_in_meta(root: pathlib.Path) -> Expect:
    """meta.json's parameter list with every field of the wrong type (a shape of strings, a
    numel that is a list, a dtype that is a number, entries that are not objects): the replay's
    layer table shows those fields as unknown, and the dashboard's frame builds."""
    path = root / "run"
    meta(path, params=[
        {"name": "w", "shape": ["a"], "numel": "a", "dtype": 5, "requires_grad": "yes"},
        {"name": "v", "shape": 7, "numel": [1], "device": {"x": 1}, "in_optimizer": None},
        {"name": "u", "shape": [2.5, -1], "numel": 1e300},
        "x", 5, {"name": ["a list"]},
    ])  # fmt: skip
    (path / "steps.jsonl").write_bytes(good_steps(3))
    (path / "layers.jsonl").write_bytes(lines([
        {"step": float(i), "grad_norm/w": 0.5, "grad_norm/v": 0.1, "grad_norm/u": 0.2,
         "param_norm/w": 1.0}
        for i in range(3)
    ]))  # fmt: skip
    return Expect(steps=[0.0, 1.0, 2.0], listed=1, extra=[_param_table])


def _param_table(root: pathlib.Path) -> list[str]:
    import nbmonitor.replay as replay

    opened = replay.open(root / "run")
    opened.frame(detail=True)
    layers = opened.state().model.layers
    params = {p.name: p for p in layers.params} if layers is not None else {}
    problems = []
    for name in ("w", "v", "u"):
        info = params.get(name)
        if info is None or info.shape != () or info.numel != 0:
            problems.append(f"layer {name} read as {info}, expected unknown shape and size")
    if params.get("w") is not None and params["w"].dtype != "?":
        problems.append(f"a numeric dtype read as {params['w'].dtype!r}")
    return problems


def _watched(root: pathlib.Path) -> list[str]:
    from nbmonitor.runs.job import JobTail
    from nbmonitor.runs.watch import RunsWatch

    rows = RunsWatch(root).poll()
    problems = [] if len(rows) == 2 else [f"RunsWatch gave {rows}"]
    tail = JobTail(root / "job", missing_s=0.0)
    tail.poll()
    if tail.world_size != 1 or not tail.closed:  # no world size: the ranks there are the job
        problems.append(f"JobTail of a job of 10^400 ranks: {tail.world_size}, {tail.closed}")
    return problems


ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[31m\u202e\x9b"


def hostile_texts(root: pathlib.Path) -> Expect:
    path = root / f"run{ESC}"
    meta(path, name=ESC, start_time=ESC * 3, backend={"name": ESC}, status="running", steps=None,
         host="elsewhere", pid=1)  # fmt: skip
    (path / "steps.jsonl").write_bytes(lines([{"step": 0.0, f"loss{ESC}": 1.0, "loss": 2.0}]))
    (path / "events.jsonl").write_bytes(lines([{"time": 1.0, "rule": ESC, "message": ESC}]))
    return Expect(steps=[0.0], events=1, listed=1, extra=[_printed_clean])


def _printed_clean(root: pathlib.Path) -> list[str]:
    from nbmonitor.runs import list_runs

    text = str(list_runs(root))
    bad = [c for c in text if (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) < 0xA0 or c == "\u202e"]
    return [f"list_runs prints control characters {bad[:5]!r}"] if bad else []


# -- permissions (simulated: the suite may run as root) --------------------------------------


def permissions(root: pathlib.Path) -> Expect:
    plain(root, "locked_steps")
    plain(root, "locked_meta")
    plain(root, "locked_folder")
    plain(root, "fine")
    _DENY.update({"locked_meta/meta.json", "locked_steps/steps.jsonl", "locked_folder"})
    return Expect(listed=4, unreadable=2)


_DENY: set[str] = set()


def install_denials() -> None:
    """os.open and os.scandir raise PermissionError for the paths in _DENY (as a chmod 000
    would for a user other than root)."""
    real_open, real_listdir = os.open, os.listdir

    def denied(path: object, dir_fd: int | None) -> bool:
        where = os.fspath(path) if isinstance(path, (str, os.PathLike)) else ""
        if dir_fd is not None:
            with _quiet():
                where = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), where)
        return any(where.endswith("/" + d) for d in _DENY)

    def fake_open(path: object, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if denied(path, dir_fd):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)  # type: ignore[arg-type]

    def fake_listdir(path: object = ".") -> list[str]:
        if isinstance(path, int):
            with _quiet():
                if any(os.readlink(f"/proc/self/fd/{path}").endswith("/" + d) for d in _DENY):
                    raise PermissionError(13, "Permission denied")
        return real_listdir(path)  # type: ignore[arg-type]

    os.open = fake_open  # type: ignore[assignment]
    os.listdir = fake_listdir  # type: ignore[assignment]


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return isinstance(exc[1], OSError)


# -- concurrent writers ----------------------------------------------------------------------


def _writer(fn: Callable[[threading.Event], None]) -> threading.Event:
    stop = threading.Event()
    threading.Thread(target=fn, args=(stop,), daemon=True).start()
    _KEEP.append(stop)
    return stop


def concurrent_tearing(root: pathlib.Path) -> Expect:
    """A writer appending records in pieces of random length (torn lines all the time)."""
    path = root / "run"
    meta(path, status="running", steps=None)
    rng = np.random.default_rng(1)
    data = lines([{"step": float(i), "v": 2.0 * i} for i in range(20_000)])

    def write(stop: threading.Event) -> None:
        with open(path / "steps.jsonl", "ab", buffering=0) as f:
            at = 0
            while at < len(data) and not stop.is_set():
                n = int(rng.integers(1, 400))
                f.write(data[at : at + n])
                at += n

    _writer(write)
    return Expect(listed=1, extra=[_consistent_while_written])


def concurrent_truncate_replace_delete(root: pathlib.Path) -> Expect:
    """A writer that truncates, replaces (rename + new file), rewrites meta.json and the
    sidecar, and finally deletes the whole run while it is read."""
    path = root / "run"
    meta(path, status="running", steps=None, sidecar="columns")
    rng = np.random.default_rng(2)

    def write(stop: threading.Event) -> None:
        step = 0
        for i in range(300):
            if stop.is_set():
                return
            with _quiet():
                with open(path / "steps.jsonl", "ab") as f:
                    f.write(
                        lines([{"step": float(step + k), "v": 2.0 * (step + k)} for k in range(20)])
                    )
                step += 20
                what = i % 5
                if what == 1:
                    os.truncate(path / "steps.jsonl", int(rng.integers(0, 500)))
                elif what == 2:
                    os.replace(path / "steps.jsonl", path / "old.jsonl")
                elif what == 3:
                    (path / "meta.tmp").write_text(json.dumps({"status": "running", "pid": i}))
                    os.replace(path / "meta.tmp", path / "meta.json")
                elif what == 4:
                    span = (0, int(rng.integers(0, 2000)), 3)
                    chunk = path / "columns" / "steps" / "000000.npz"
                    write_chunk_v1(chunk, ["step"], np.arange(3.0)[None], span)
            time.sleep(0.001)
        with _quiet():
            for p in sorted(path.rglob("*"), reverse=True):
                p.rmdir() if p.is_dir() else p.unlink()
            path.rmdir()

    _writer(write)
    return Expect(extra=[_consistent_while_written])


def _consistent_while_written(root: pathlib.Path) -> list[str]:
    """Read for a while as the writer writes: every record returned is whole (v == 2 step)."""
    import warnings

    from nbmonitor.runs import Tail, open_run
    from nbmonitor.runs.format import RunDirError

    problems: list[str] = []
    path = root / "run"
    tail = Tail(path)
    deadline = time.monotonic() + 1.5
    seen = 0
    while time.monotonic() < deadline:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                cols = open_run(path).history()
                step, v = cols.get("step"), cols.get("v")
                if step is not None and v is not None:
                    ok = np.isnan(v) | (v == 2 * step)
                    if not ok.all():
                        problems.append("history() returned a torn record")
            except RunDirError:
                pass
            try:
                for r in tail.poll().get("steps", []):
                    seen += 1
                    if r.get("v") != 2 * r.get("step", 0):
                        problems.append(f"tail returned a torn record {r}")
            except RunDirError:
                pass
    tail.close()
    return problems[:3]


def many_runs(root: pathlib.Path) -> Expect:
    """2,000 runs and a few hostile ones among them: all listed, each on its own row."""
    for i in range(2000):
        path = root / f"r{i:04d}"
        path.mkdir(parents=True)
        fields = {"format_version": 1, "status": "closed", "steps": i, "start_timestamp": 1.7e9 + i}
        (path / "meta.json").write_text(json.dumps(fields))
        (path / "steps.jsonl").write_bytes(b'{"step":0,"loss":1.5}\n')
    os.mkfifo(root / "r0007" / "steps.jsonl.tmp")
    (root / "r0008" / "meta.json").unlink()
    os.mkfifo(root / "r0008" / "meta.json")
    (root / "r0009" / "meta.json").write_bytes(b"[" * 100_000)
    return Expect(listed=2000, unreadable=2)


CASES: dict[str, Callable[[pathlib.Path], Expect]] = {
    f.__name__: f
    for f in (
        meta_fifo,
        steps_fifo,
        meta_dev_zero,
        steps_dev_zero,
        steps_socket,
        streams_are_folders,
        meta_is_a_folder,
        chunk_fifo,
        run_folder_symlink_in_runs,
        files_escape,
        sidecar_escape,
        symlinked_streams,
        symlinked_rank,
        chunk_lies_about_rows,
        chunk_header_claims_a_trillion,
        chunk_values_disagree,
        chunk_of_objects,
        long_lines,
        huge_meta,
        broken_lines,
        non_finite_values,
        huge_numbers_in_meta,
        param_types_in_meta,
        deep_nesting,
        bad_meta,
        hostile_texts,
        permissions,
        concurrent_tearing,
        concurrent_truncate_replace_delete,
        many_runs,
    )
}
