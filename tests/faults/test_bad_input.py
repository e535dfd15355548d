"""Bad input, all of it: each bad attach() argument, Thresholds field, log() value and open()
path fails at the call with one line that names the argument, never later in the sampler and
never as a raw library exception."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import mlp

import nbmonitor
from nbmonitor import Thresholds

LONG = "n" * 300  # longer than a file name may be (255 bytes on common filesystems)

# (option, value, words the message must hold besides the option's name)
ATTACH = [
    ("interval", 0, ""),
    ("interval", -1.0, ""),
    ("interval", math.nan, ""),
    ("interval", math.inf, ""),
    ("interval", "0.5", ""),
    ("interval", True, ""),
    ("interval", None, ""),
    ("total_steps", 0, ""),
    ("total_steps", -5, ""),
    ("total_steps", 10.5, ""),
    ("total_steps", "100", ""),
    ("total_steps", True, ""),
    ("run_dir", "", ""),
    ("run_dir", "runs\0x", ""),
    ("run_dir", 123, ""),
    ("run_dir", None, ""),
    ("name", 5, ""),
    ("name", "a\0b", ""),
    ("name", LONG, ""),
    ("backend", "gpu", ""),
    ("backend", 1, ""),
    ("display", "yes", ""),
    ("display", None, ""),
    ("layer_every", -1, ""),
    ("layer_every", 2.5, ""),
    ("layer_every", "100", ""),
    ("layer_every", True, ""),
    ("layer_group", "layer", ""),
    ("layer_group", None, ""),
    ("activations", "yes", ""),
    ("check_forward", 1, ""),
    ("phases", "on", ""),
    ("on_nan", "ignore", ""),
    ("on_nan", True, ""),
    ("thresholds", 5, ""),
    ("thresholds", {"bogus": 1.0}, "bogus"),
    ("thresholds", [1, 2], ""),
]

THRESHOLDS = [
    ("explode_factor", 0.0),
    ("explode_factor", math.nan),
    ("explode_factor", "10"),
    ("explode_factor", None),
    ("explode_abs", -1.0),
    ("explode_abs", math.nan),
    ("explode_abs", "big"),
    ("vanish_ratio", -1e-7),
    ("vanish_steps", 0),
    ("vanish_steps", 2.5),
    ("vanish_steps", "20"),
    ("update_ratio_high", math.inf),
    ("update_ratio_low", 0.0),
    ("spike_factor", -5.0),
    ("spike_range_fraction", -0.1),
    ("spike_range_fraction", math.nan),
    ("plateau_window", 4),
    ("plateau_window", 200.5),
    ("plateau_tolerance", -0.01),
    ("plateau_tolerance", math.nan),
    ("plateau_progress", -1.0),
    ("plateau_progress", math.nan),
    ("dead_fraction", 0.0),
    ("dead_fraction", 1.5),
    ("window", 0),
    ("window", True),
    ("min_history", 0),
    ("rearm_steps", -1),
    ("rearm_steps", 1.5),
    ("sustain_steps", 0),
    ("temperature_c", math.nan),
    ("temperature_c", "hot"),
    ("memory_fraction", 0.0),
    ("memory_fraction", 2.0),
    ("idle_util_percent", -5.0),
    ("idle_util_percent", 150.0),
]

LOG = [
    ("acc", "0.93"),
    ("acc", None),
    ("acc", [1.0, 2.0]),
    ("acc", {"a": 1.0}),
    ("acc", b"1"),
    ("acc", torch.ones(3)),
    ("acc", torch.tensor(1 + 2j)),
    ("step", 1.0),
    ("lr", 0.1),
]


def _one_line(exc: BaseException, *words: str) -> None:
    message = str(exc)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize(("option", "value", "word"), ATTACH)
def test_a_bad_attach_option_fails_at_the_call(tmp_path, option, value, word):
    options: dict[str, Any] = {"run_dir": tmp_path, "display": False, option: value}
    model = mlp()
    with pytest.raises((TypeError, ValueError)) as info:
        nbmonitor.attach(model, **options).close()
    assert type(info.value).__module__ == "builtins"  # not a library's own exception
    _one_line(info.value, option, word)
    assert not list(tmp_path.iterdir()) or option != "run_dir"  # nothing was started


def test_run_dir_that_is_a_file_fails_at_the_call(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("x")
    with pytest.raises((TypeError, ValueError, OSError)) as info:
        nbmonitor.attach(mlp(), run_dir=target, display=False).close()
    _one_line(info.value, "run_dir")


@pytest.mark.parametrize(
    ("model", "optimizer", "word"),
    [
        (None, None, "model"),
        ("model", None, "model"),
        (mlp(), "sgd", "optimizer"),
        (mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1), "optimizer"),
        (mlp().to("meta"), None, "meta"),
        (torch.nn.ReLU(), torch.optim.SGD(mlp().parameters(), lr=0.1), "has no parameters"),
    ],
    ids=[
        "none",
        "str",
        "optimizer-str",
        "optimizer-of-another-model",
        "meta-model",
        "parameterless-model-with-an-optimizer",
    ],
)
def test_a_bad_model_or_optimizer_fails_at_the_call(tmp_path, model, optimizer, word):
    with pytest.raises((TypeError, ValueError)) as info:
        nbmonitor.attach(model, optimizer, run_dir=tmp_path, display=False).close()
    _one_line(info.value, word)


@pytest.mark.parametrize(("field", "value"), THRESHOLDS)
def test_a_bad_threshold_fails_at_the_call(field, value):
    with pytest.raises((TypeError, ValueError)) as info:
        Thresholds(**{field: value})
    _one_line(info.value, f"Thresholds.{field}")


@pytest.mark.parametrize(("key", "value"), LOG, ids=[f"{k}-{i}" for i, (k, _) in enumerate(LOG)])
def test_a_bad_log_value_fails_at_the_call(tmp_path, key, value):
    model = mlp()
    mon = nbmonitor.attach(model, run_dir=tmp_path, display=False, interval=60)
    with mon, pytest.raises(TypeError) as info:
        mon.log(**{key: value})
    _one_line(info.value, f"log({key}=")


def _paths(tmp_path: Path) -> list[object]:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    return ["", "runs\0x", str(a_file), str(tmp_path / LONG), str(tmp_path / "missing"), 5, None]


@pytest.mark.parametrize("which", range(7))
def test_a_bad_open_path_fails_at_the_call(tmp_path, which):
    path = _paths(tmp_path)[which]
    with pytest.raises((TypeError, ValueError, FileNotFoundError)) as info:
        nbmonitor.open(path)  # type: ignore[arg-type]
    assert str(info.value).startswith("nbmonitor: "), repr(info.value)  # not pathlib's own
    _one_line(info.value)


def test_the_table_has_at_least_50_cases():
    assert len(ATTACH) + len(THRESHOLDS) + len(LOG) + 7 + 5 + 1 >= 50
