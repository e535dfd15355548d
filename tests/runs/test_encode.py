"""The writer's encoder (nbmonitor/runs/encode.py): the bytes of the json module's encoder for
every row, whichever path a row takes, and the columns ``to_columns`` makes of the same rows."""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from nbmonitor.runs.decode import Columns, to_columns
from nbmonitor.runs.encode import MAX_KEY_SETS, LineEncoder
from nbmonitor.runs.format import encode_lines, json_default

KEYS = [
    "step", "loss", "time", "lr", "grad_norm", "phase_data_s", "mfu_percent",
    "financial", "info", "nan", "inf", "Infinity", "NaN",  # letters the spelling replaces
    "100%", "%s", "%%d", 'say "hi"', "back\\slash", "tab\tnew\nline", "ctl\x01",
    "café", "损失", "emoji😀", "", " ", "param_norm/0.weight", "e-06,", ":0.0000",
]  # fmt: skip


class Half(float):
    """A float subclass whose repr is not float's (numpy.float64's is not either)."""

    def __repr__(self) -> str:
        return "Half()"


def _value(rng: random.Random) -> object:
    pick = rng.random()
    if pick < 0.55:
        return _float(rng)
    return rng.choice(
        [
            1, -7, 2**64, 10**400, True, False, None, "x", "naïve", "nan", [1.0, 2.0],
            {"a": 1.0}, np.float64(0.1), np.float32(0.5), Half(0.25), math.nan, math.inf,
        ]
    )  # fmt: skip


def _float(rng: random.Random) -> float:
    pick = rng.random()
    if pick < 0.1:
        return rng.choice([math.nan, -math.nan, math.inf, -math.inf, -0.0, 0.0])
    if pick < 0.2:
        return rng.choice([1e16, 1e-7, 1e-5, 1e-4, 5e-324, 1.7976931348623157e308, 1e308, 2.0])
    if pick < 0.3:  # any bit pattern (NaN payloads, subnormals, every exponent)
        return float(np.frombuffer(rng.randbytes(8), dtype=np.float64)[0])
    return rng.uniform(-1, 1) * 10 ** rng.uniform(-12, 20)


def _rows(rng: random.Random, n: int, floats_only: float) -> list[dict[str, object]]:
    """Rows from a few key sets (some in two orders), most of them all floats."""
    sets = [rng.sample(KEYS, rng.randint(0, 8)) for _ in range(4)]
    sets.append(list(reversed(sets[0])))
    rows = []
    for _ in range(n):
        keys = rng.choice(sets)
        if rng.random() < floats_only:
            rows.append({k: _float(rng) for k in keys})
        else:
            rows.append({k: _value(rng) for k in keys})
    return rows


def _reference(rows: Sequence[Mapping[str, object]]) -> bytes:
    """The json module, each row on its own, as the run log always wrote it."""
    text = "".join(
        json.dumps(dict(r), allow_nan=True, separators=(",", ":"), default=json_default) + "\n"
        for r in rows
    )
    return text.encode()


def assert_same_columns(got: Columns | None, want: Columns) -> None:
    assert got is not None
    assert got.rows == want.rows and list(got) == list(want)
    assert list(got.dense) == list(want.dense) and list(got.sparse) == list(want.sparse)
    for key, col in want.dense.items():
        assert got.dense[key].dtype == np.float64
        assert got.dense[key].tobytes() == col.tobytes(), key
    for key, (idx, values) in want.sparse.items():
        assert (
            got.sparse[key][0].dtype == np.int64 and got.sparse[key][0].tobytes() == idx.tobytes()
        )
        assert got.sparse[key][1].tobytes() == values.tobytes(), key


@pytest.mark.parametrize("seed", range(12))
def test_random_rows_encode_to_the_json_modules_bytes(seed: int) -> None:
    rng = random.Random(seed)
    encoder = LineEncoder()
    floats_only = [1.0, 0.9, 0.5][seed % 3]
    pauses: list[int] = []
    expected = 0
    for call in range(6):  # key sets recur across calls: templates are built and used
        rows = _rows(rng, rng.randint(0, 60), floats_only)
        data, cols = encoder.encode(
            rows, columns=True, pause=lambda: pauses.append(1), every=1 + call
        )
        expected += max(0, -(-len(rows) // (1 + call)) - 1)
        assert len(pauses) == expected
        assert data == _reference(rows) == encode_lines(rows)
        assert_same_columns(cols, to_columns(rows))
        assert encoder.encode(rows)[1] is None  # columns only when asked
    if floats_only == 1.0:  # and not every row went to the json encoder
        assert any(t is not None for t in encoder._templates.values())


def test_the_templates_were_used() -> None:
    # The random test passes as well if every row went to the json encoder: here the rows of a
    # recurring key set go through a template, with NaN and infinities in them.
    rows = [{"step": float(i), "loss": 1 / (i + 1), "mfu_percent": math.nan} for i in range(50)]
    rows[7]["loss"] = math.inf
    rows[8]["loss"] = -math.inf
    encoder = LineEncoder()
    encoder.encode(rows[:1])
    data, cols = encoder.encode(rows, columns=True)
    assert [t is not None for t in encoder._templates.values()] == [True]
    assert data == _reference(rows)
    assert b'{"step":7.0,"loss":Infinity,"mfu_percent":NaN}\n' in data
    assert_same_columns(cols, to_columns(rows))


def test_the_values_json_spells_its_own_way() -> None:
    row = {
        "a": -0.0, "b": 1e16, "c": 1e-7, "d": math.nan, "e": math.inf, "f": -math.inf,
        "g": 1e-5, "h": 5e-324, "i": 1.7976931348623157e308, "j": 0.1, "k": 1e22, "l": 123.0,
    }  # fmt: skip
    encoder = LineEncoder()
    for _ in range(2):  # json's path, then the template's
        data, _ = encoder.encode([row])
        assert data == (json.dumps(row, allow_nan=True, separators=(",", ":")) + "\n").encode()
        assert data == (
            b'{"a":-0.0,"b":1e+16,"c":1e-07,"d":NaN,"e":Infinity,"f":-Infinity,"g":1e-05,'
            b'"h":5e-324,"i":1.7976931348623157e+308,"j":0.1,"k":1e+22,"l":123.0}\n'
        )
    assert encoder._templates[tuple(row)] is not None


def test_keys_with_the_spelled_letters_are_not_spelled() -> None:
    rows = [{"financial": math.nan, "info": math.inf, "nan": -math.inf, "%s": 1.0}] * 2
    data, _ = LineEncoder().encode(rows)
    assert data == _reference(rows)
    assert data.startswith(b'{"financial":NaN,"info":Infinity,"nan":-Infinity,"%s":1.0}\n')


def test_a_sum_past_float64_keeps_its_finite_values() -> None:
    rows = [{"a": 1e308, "b": 1e308, "c": -0.0}] * 3
    assert LineEncoder().encode(rows)[0] == _reference(rows)


def test_other_mappings_and_keys_that_are_not_str() -> None:
    rows: list[Mapping[object, object]] = [
        OrderedDict([("b", 1.0), ("a", 2.0)]),
        {1: 5.0, None: 3.0, 1.5: 4.0},
        {True: 5.0, None: 3.0, 1.5: 4.0},  # equal keys as far as a dict is concerned
    ]
    encoder = LineEncoder()
    for _ in range(2):
        data, _ = encoder.encode(rows)  # type: ignore[arg-type]
        assert data == _reference(rows)  # type: ignore[arg-type]
        assert data.endswith(b'{"1":5.0,"null":3.0,"1.5":4.0}\n{"true":5.0,"null":3.0,"1.5":4.0}\n')


def test_what_the_json_encoder_refuses_is_refused_still() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        LineEncoder().encode([{"a": 1.0}, {"a": loop}])


def test_key_sets_that_never_recur_are_bounded() -> None:
    encoder = LineEncoder()
    for i in range(3 * MAX_KEY_SETS):
        rows = [{"step": float(i), f"probe_{i}": 1.0}]
        assert encoder.encode(rows, columns=True)[0] == _reference(rows)
    assert len(encoder._templates) <= MAX_KEY_SETS
    assert all(t is None for t in encoder._templates.values())  # none was ever built


def test_several_key_sets_in_one_batch_make_to_columns_columns() -> None:
    # The layers stream: rows of norms and ratios, and a row of gradient norms, keys apart
    # but "step"; and steps with a metric logged now and then (sparse).
    norms = [{"step": float(s), "param_norm/a": 1.0 * s, "update_ratio/a": 0.5} for s in range(4)]
    grads = [{"step": 3.0, "grad_norm/a": 2.0}]
    logged = [{"step": float(s), "loss": 0.1, **({"acc": 0.9} if s % 3 == 0 else {})}
              for s in range(10)]  # fmt: skip
    # A key in two key sets: rare (sparse, its rows merged in order) and common (NaN-filled).
    rare = [{"step": 0.0, "x": 1.0}, *logged, {"x": 2.0, "step": 1.0}]
    common = [{"step": 0.0, "y": 1.0}, {"y": 2.0, "step": 1.0}, {"step": 2.0}]
    for rows in (norms + grads, grads + norms, logged, norms * 3 + grads * 5, rare, common):
        encoder = LineEncoder()
        encoder.encode(rows)
        data, cols = encoder.encode(rows, columns=True)
        assert None not in encoder._templates.values()
        assert data == _reference(rows)
        assert_same_columns(cols, to_columns(rows))
