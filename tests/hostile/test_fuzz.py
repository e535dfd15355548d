"""Fuzzing the JSON Lines decoder and the sidecar loader against a reference: ``json.loads``
of each line on its own, with the reading contract's rules written out plainly here."""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.runs.runs_helpers import reference_columns

from nbmonitor.runs import RunDataWarning, decode, open_run, sidecar
from nbmonitor.runs.format import MAX_DEPTH
from nbmonitor.sinks import RunLogSink

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# Each example of these writes and reads a run folder: fewer of them.
FILES = settings(SETTINGS, max_examples=25)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(["step", "time", "loss", "lr", "a/b", "", "é", "k\x1b"]) | st.text(
    max_size=6
)
records = st.dictionaries(keys, values, max_size=6)


def _json_line(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


hostile_lines = st.one_of(
    records.map(_json_line),
    records.map(_json_line).map(lambda b: b[: max(1, len(b) // 2)]),  # cut short
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.integers(1, 3 * MAX_DEPTH).map(lambda n: b'{"step": 1, "x": ' + b"[" * n + b"]" * n + b"}"),
    st.integers(1, 3 * MAX_DEPTH).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.sampled_from([b"", b"  ", b"[1]", b"null", b'"s"', b"NaN", b'{"step": Infinity}',
                     b'{"step": 1e400}', b'{"step": "3"}', b'{"step": 2.5}', b'{"\\ud800": 1}',
                     b'{"a": 1' + b"9" * 30 + b"}", b"\xff{}", b'{"a":1}\r']),
)  # fmt: skip


def _as_read(v: Any) -> Any:
    """orjson reads an integer past 64 bits as the float nearest it (the stdlib as an int):
    the same number once in a float64 column, so the reference reads it so too."""
    if type(v) is int and not -(2**63) <= v < 2**64:
        return float(v)
    if isinstance(v, dict):
        return {k: _as_read(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_as_read(x) for x in v]
    return v


def _depth(v: object) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def reference(lines: list[bytes]) -> tuple[list[str], list[int]]:
    """Records (as repr, NaN-comparable) and the numbers of the bad lines, by the contract:
    UTF-8, one JSON value per line, nesting at most MAX_DEPTH, an object, typed step."""
    got, bad = [], []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            bad.append(i)
            continue
        if not isinstance(value, dict) or _depth(value) > MAX_DEPTH:
            bad.append(i)
            continue
        step = value.get("step")
        finite_int = (type(step) is int and abs(step) <= 2**53) or (
            type(step) is float and math.isfinite(step) and step.is_integer() and abs(step) <= 2**53
        )
        if step is not None and not finite_int:
            bad.append(i)
            continue
        got.append(repr(_as_read(value)))
    return got, bad


@SETTINGS
@given(st.lists(hostile_lines, max_size=12))
def test_decoder_agrees_with_json_loads_per_line(lines: list[bytes]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    decoded = decode.decode_lines(data, check=decode.CHECKS["steps"])
    want, bad = reference(lines)
    assert [repr(r) for r in decoded.records] == want
    assert [b.line for b in decoded.bad] == bad
    assert all("\n" not in b.why for b in decoded.bad)


@SETTINGS
@given(st.lists(hostile_lines, max_size=8), st.integers(1, 64))
def test_line_splitter_never_holds_a_long_line(lines: list[bytes], piece: int) -> None:
    """Fed in pieces of any size, lines past the bound are reported and never returned."""
    data = b"".join(line + b"\n" for line in lines)
    split = decode.LineSplitter(max_line=16)
    returned: dict[int, bytes] = {}
    bad: list[int] = []
    for at in range(0, len(data), piece):
        got, first, b = split.feed(data[at : at + piece])
        for i, line in enumerate(got.split(b"\n")[:-1]):
            returned[first + i] = line
        bad += [x.line for x in b]
        assert len(split.rest) <= 16
    assert split.offset == len(data) and split.line == len(lines) + 1
    for i, line in enumerate(lines, 1):
        if len(line) > 16:  # reported, never returned (at most a blank in its place)
            assert i in bad and not returned.get(i)
        else:
            assert returned[i] == line and i not in bad


numeric = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**62), 2**62),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sidecar, "CHUNK_VALUES", 24)


@FILES
@given(
    st.lists(
        st.lists(st.dictionaries(st.sampled_from(list("abcdefgh")), numeric, max_size=5),
                 min_size=1, max_size=6),
        min_size=1, max_size=8,
    ),
    st.booleans(),
)  # fmt: skip
def test_sidecar_reads_what_the_text_says(
    tmp_path_factory: pytest.TempPathFactory,
    small_chunks: None,
    ticks: list[list[Any]],
    close: bool,
) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    log = RunLogSink.create(root, "f", {})
    step = 0
    for tick in ticks:
        rows = []
        for r in tick:
            rows.append({"step": float(step), **r})
            step += 1
        log.write_steps(rows)
        log.flush()
    if close:
        log.close()
    got = open_run(log.path).history()
    want = reference_columns(log.path / "steps.jsonl")
    assert list(got) == list(want)
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k
    log.close()


@FILES
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6))
def test_a_damaged_chunk_never_costs_the_rows(
    tmp_path_factory: pytest.TempPathFactory, small_chunks: None, flips: list[tuple[int, int]]
) -> None:
    root = tmp_path_factory.mktemp("flip")
    log = RunLogSink.create(root, "f", {})
    for i in range(10):
        log.write_steps([{"step": float(i), "loss": 1.0 / (i + 1), ("x" if i % 4 else "y"): 2.0}])
        log.flush()
    log.close()
    chunks = sorted((log.path / "columns" / "steps").iterdir())
    assert chunks
    for at, byte in flips:
        target = chunks[at % len(chunks)]
        raw = bytearray(target.read_bytes())
        raw[at % len(raw)] = byte
        target.write_bytes(bytes(raw))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunDataWarning)  # the text is whole: nothing to warn
        got = open_run(log.path).history()
    want = reference_columns(log.path / "steps.jsonl")
    assert len(got["step"]) == len(want["step"]) == 10
    np.testing.assert_array_equal(got["step"], want["step"])
