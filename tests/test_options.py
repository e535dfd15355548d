"""The attach options are declared once: the typed keywords (AttachOptions) and the resolved
values with defaults (Options) name the same options with the same types, and every bad value
gets a one-line error at the call."""

from __future__ import annotations

import dataclasses
import pathlib
import typing

import pytest

from nbmonitor.health import Thresholds
from nbmonitor.options import AttachOptions, Options
from nbmonitor.sinks.exporter import Exporter


def test_typed_keywords_and_resolved_options_are_the_same_set() -> None:
    hints = typing.get_type_hints(AttachOptions)
    fields = {f.name: f for f in dataclasses.fields(Options)}
    assert list(hints) == list(fields)
    resolved = typing.get_type_hints(Options)
    for name, hint in hints.items():
        if name == "thresholds":  # a dict of fields is accepted, and resolved to Thresholds
            assert resolved[name] is Thresholds
            continue
        if name == "export":  # names, objects or a list of them, resolved to exporters
            assert resolved[name] == tuple[Exporter, ...]
            continue
        assert resolved[name] == hint, name
    # every option is documented where it is declared
    assert all(f"{name}:" in (AttachOptions.__doc__ or "") for name in hints)


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"interval": 0}, ValueError, "interval must be a number of seconds > 0"),
        ({"total_steps": -1}, ValueError, "total_steps must be a positive int"),
        ({"name": 3}, TypeError, "name must be a str or None"),
        ({"backend": "tpu"}, ValueError, "unknown backend 'tpu'"),
        ({"layer_every": -1}, ValueError, "layer_every must be an int >= 0"),
        ({"layer_group": "block"}, ValueError, "layer_group must be 'param' or 'module'"),
        ({"on_nan": "ignore"}, ValueError, "on_nan must be 'warn' or 'raise'"),
        ({"thresholds": {"nope": 1.0}}, ValueError, "unknown threshold"),
        ({"thresholds": 3}, TypeError, "thresholds must be a dict"),
        ({"intervl": 1.0}, TypeError, "did you mean 'interval'"),
        ({"start_step": -1}, ValueError, "start_step must be an int >= 0"),
        ({"start_step": 2.5}, ValueError, "start_step must be an int >= 0"),
        ({"export": "tensorbaord"}, ValueError, "did you mean 'tensorboard'"),
        ({"export": 3}, TypeError, "export= takes"),
        ({"export": ["csv", "csv"]}, ValueError, "names csv more than once"),
    ],
)
def test_bad_options_get_one_line_errors(kwargs: dict[str, object], error: type, text: str) -> None:
    with pytest.raises(error, match=text) as info:
        Options.from_kwargs(kwargs)
    assert "\n" not in str(info.value)


def test_defaults() -> None:
    options = Options.from_kwargs({})
    assert options == Options()
    assert options.interval == 0.5 and options.layer_every == 100 and options.display is True
    meta = options.as_meta()
    assert meta["run_dir"] == "runs" and isinstance(meta["thresholds"], dict)


def test_meta_json_records_the_options_and_thresholds_in_force(tmp_path: pathlib.Path) -> None:
    import json

    import torch

    import nbmonitor

    model = torch.nn.Linear(2, 1)
    with nbmonitor.attach(
        model, run_dir=tmp_path, display=False, layer_every=7, thresholds={"explode_factor": 4.0}
    ) as mon:
        pass
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    # Every threshold, the one given and the defaults, as the rules used them.
    want = dataclasses.asdict(nbmonitor.Thresholds(explode_factor=4.0))
    assert meta["thresholds"] == want and want["explode_factor"] == 4.0
    assert meta["attach"]["layer_every"] == 7
    assert set(meta["attach"]) == {f.name for f in dataclasses.fields(Options)} - {"thresholds"}
    assert (meta["steps"], meta["last_step"]) == (0, 0)
