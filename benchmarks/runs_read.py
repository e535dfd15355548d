"""Reading runs: opening a long run, and a tail refresh, timed on runs written by the run log.

Run from the repo root: ``PYTHONPATH=. python benchmarks/runs_read.py [--rows N] [--metrics M]``

To compare two checkouts' readers on the same files: ``--write-only DIR`` (with either
checkout on the path), then ``--read DIR`` with each in turn, interleaved; ``--write-many N
--list-dir DIR`` writes N small runs and ``--read '' --list-dir DIR`` times ``list_runs``.

Writes, with ``RunLogSink`` in ticks of ``--tick`` rows (step, time and M-2 random metrics,
so M keys in all), a closed run of N rows and the same run left open as a killed writer leaves
it (no close: the rows since the last sidecar chunk exist only as text). Then reports the
median and range of ``--repeats`` timings of:

* ``open_run(path).history()`` on the closed run, the killed run, and a text-only run of
  ``--text-rows`` rows (no sidecar, as every run before the re-cut; larger would need GBs);
* one ``Tail.poll()`` that finds ``--new`` new step records, at the end of the long run and
  at the end of a run of ``--new`` rows (the cost must not depend on the run's length);
* what the sidecar adds to the writer per tick (to_columns of one tick's rows), beside the
  JSON encoding the run log always did.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

from nbmonitor.runs import Tail, decode, open_run
from nbmonitor.runs.decode import to_columns
from nbmonitor.runs.format import encode_lines
from nbmonitor.runs.sidecar import read_chunks
from nbmonitor.sinks import Batch, RunLogSink


def _rows(start: int, n: int, metrics: int, rng: np.random.Generator) -> list[dict[str, object]]:
    names = [f"metric_{i}" for i in range(metrics - 2)]
    values = rng.standard_normal((n, len(names))).tolist()
    return [
        {
            "step": float(start + k),
            "time": 1.7e9 + (start + k) * 0.05,
            **dict(zip(names, v, strict=True)),
        }
        for k, v in enumerate(values)
    ]


def _write(root: pathlib.Path, name: str, rows: int, args: argparse.Namespace) -> RunLogSink:
    rng = np.random.default_rng(0)
    log = RunLogSink.create(root, name, {})
    for start in range(0, rows, args.tick):
        log.write(Batch({"steps": _rows(start, min(args.tick, rows - start), args.metrics, rng)}))
        log.flush()
    return log


def _times(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _report(label: str, ts: list[float], unit: str = "s") -> None:
    scale = 1e3 if unit == "ms" else 1.0
    med, lo, hi = statistics.median(ts) * scale, min(ts) * scale, max(ts) * scale
    print(f"  {label:<52} median {med:8.3f} {unit}  (range {lo:.3f} .. {hi:.3f}, n={len(ts)})")


def _tail_poll(log: RunLogSink, args: argparse.Namespace, start: int) -> list[float]:
    """Times of polls that each find ``args.new`` new records at the end of ``log``'s run."""
    rng = np.random.default_rng(1)
    size = (log.path / "steps.jsonl").stat().st_size
    tail = Tail(log.path, offsets={"steps": size}, streams=["steps"])
    tail.poll()
    out = []
    for i in range(args.repeats * 3):
        log.write(Batch({"steps": _rows(start + i * args.new, args.new, args.metrics, rng)}))
        log.flush()
        t0 = time.perf_counter()
        got = tail.poll()
        out.append(time.perf_counter() - t0)
        assert len(got["steps"]) == args.new
    return out


def write_only(folder: pathlib.Path, args: argparse.Namespace) -> None:
    """Write the closed and the killed run into ``folder`` (with whichever nbmonitor is on the
    path: runs written by an older writer, read by both readers, compare the readers)."""
    folder.mkdir(parents=True, exist_ok=True)
    closed = _write(folder, "closed", args.rows, args)
    closed.close({"status": "closed"})
    _write(folder, "killed", args.rows + args.killed_extra, args)  # never closed
    print(f"wrote {sorted(p.name for p in folder.iterdir())}")


def _cpu_times(fn: Callable[[], object], repeats: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of ``repeats`` calls: on a machine other processes load, the CPU
    time the call itself used is what a quiet machine's wall time would be (files cached)."""
    out = []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - t0, time.process_time() - c0))
    return out


def read_only(folder: pathlib.Path, args: argparse.Namespace) -> None:
    """Time ``open_run(path).history()`` of every run in ``folder``, and ``list_runs`` of the
    folder given with --list-dir; one line per timing (wall/CPU seconds), for a driver that
    interleaves checkouts."""
    from nbmonitor.runs import list_runs

    def line(what: str, ts: list[tuple[float, float]]) -> None:
        print(f"{what} " + " ".join(f"{w:.4f}/{c:.4f}" for w, c in ts), flush=True)

    for path in sorted(folder.iterdir()) if folder.name else []:
        line(f"open {path.name}", _cpu_times(lambda p=path: open_run(p).history(), args.repeats))
    if args.list_dir:
        line(f"list {args.list_dir}", _cpu_times(lambda: list_runs(args.list_dir), args.repeats))


def write_many(folder: pathlib.Path, n: int) -> None:
    """``n`` small closed runs (meta.json, a few steps), as a long-lived runs/ folder holds."""
    rows = encode_lines([{"step": float(i), "loss": 1.0 / (i + 1)} for i in range(20)])
    for i in range(n):
        path = folder / f"20260101-{i:06d}-run"
        path.mkdir(parents=True)
        meta = {"format_version": 1, "status": "closed", "steps": 20,
                "start_timestamp": 1.7e9 + i, "start_time": "2026-01-01T00:00:00+00:00",
                "backend": {"name": "cpu"}, "files": {"steps": "steps.jsonl"}}  # fmt: skip
        (path / "meta.json").write_text(json.dumps(meta))
        (path / "steps.jsonl").write_bytes(rows)
    print(f"wrote {n} runs in {folder}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Reading runs benchmark.")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--tick", type=int, default=1000, help="rows per writer tick")
    parser.add_argument("--killed-extra", type=int, default=7000)
    parser.add_argument("--text-rows", type=int, default=100_000)
    parser.add_argument("--new", type=int, default=1000, help="records per tail refresh")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-orjson", action="store_true", help="parse with the stdlib only")
    parser.add_argument("--write-only", type=pathlib.Path, help="write the runs there, exit")
    parser.add_argument("--read", type=pathlib.Path, help="time opening the runs there, exit")
    parser.add_argument("--write-many", type=int, default=0, help="with --list-dir: N runs")
    parser.add_argument("--list-dir", type=pathlib.Path, help="time list_runs of this folder")
    args = parser.parse_args()
    if args.no_orjson:
        decode._fast_loads = None  # what a Python without orjson gets
    if args.write_many:
        return write_many(args.list_dir, args.write_many)
    if args.write_only:
        return write_only(args.write_only, args)
    if args.read:
        return read_only(args.read, args)

    root = pathlib.Path(tempfile.mkdtemp(prefix="nbmonitor-bench-"))
    try:
        parser_name = "stdlib json" if args.no_orjson else "orjson + stdlib json"
        print(f"runs of {args.rows:,} steps x {args.metrics} keys, ticks of {args.tick} rows, "
              f"text parsed with {parser_name}")  # fmt: skip
        t0 = time.perf_counter()
        closed = _write(root, "closed", args.rows, args)
        closed.close({"status": "closed"})
        print(f"  wrote the closed run in {time.perf_counter() - t0:.1f} s")
        # Never closed, as after a SIGKILL; --killed-extra rows more, so that (by default) the
        # text past the last chunk is as long as it gets with ticks of --tick rows.
        killed_rows = args.rows + args.killed_extra
        killed = _write(root, "killed", killed_rows, args)
        steps = killed.path / "steps.jsonl"
        mb = steps.stat().st_size / 2**20
        print(f"  steps.jsonl {mb:.0f} MiB")

        h = open_run(closed.path).history()
        assert len(h) == args.metrics and len(h["step"]) == args.rows
        assert len(open_run(killed.path).history()["step"]) == killed_rows
        from nbmonitor.runs.files import RunFolder

        chunks, _ = read_chunks(
            RunFolder(killed.path),
            ["columns", "steps"],
            ["steps.jsonl"],
            steps.stat().st_size,
            spans_only=True,
        )
        in_text = killed_rows - sum(b.rows for b in chunks)
        print(f"  killed run: {len(chunks)} chunks, {in_text:,} rows past them as text only")
        print("open_run(path).history()")
        _report(
            "closed run (sidecar only)",
            _times(lambda: open_run(closed.path).history(), args.repeats),
        )
        _report(
            "killed run (sidecar + text past the last chunk)",
            _times(lambda: open_run(killed.path).history(), args.repeats),
        )

        text = RunLogSink.create(root, "text", {})
        rng = np.random.default_rng(0)
        for start in range(0, args.text_rows, args.tick):
            text.write(Batch({"steps": _rows(start, args.tick, args.metrics, rng)}))
        text.close()
        shutil.rmtree(text.path / "columns")  # as a run written before the sidecar
        _report(
            f"text only, {args.text_rows:,} rows (no sidecar)",
            _times(lambda: open_run(text.path).history(), max(3, args.repeats // 2)),
        )

        print(f"Tail.poll() finding {args.new} new records")
        _report(
            f"at the end of a {args.rows:,}-step run", _tail_poll(killed, args, args.rows), "ms"
        )
        short = _write(root, "short", args.new, args)
        _report(f"at the end of a {args.new:,}-step run", _tail_poll(short, args, args.new), "ms")
        short.close()
        killed.close()

        print(f"writer, per tick of {args.tick} rows")
        rows = _rows(0, args.tick, args.metrics, np.random.default_rng(2))
        _report("JSON encoding (always)", _times(lambda: encode_lines(rows), 20), "ms")
        _report("to_columns for the sidecar", _times(lambda: to_columns(rows), 20), "ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
