"""The structural evidence the training side reads without a sync (probes/structure.py), on
real tiny loops: the loss's graph, the order of zero_grad/backward/step, the modes, the first
layer's input scale, the BatchNorm batch, autocast and the optimizer's groups."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests import structural_loops as loops
from torch import nn

from nbmonitor.health.structure import Observation, Structure


def facts(structure: Structure, kind: str, key: str) -> list[object]:
    return [o.get(key) for o in structure.of(kind)]


def test_a_healthy_loop_reads_as_healthy(tmp_path: Path) -> None:
    _, s = loops.run(tmp_path, loops.healthy, model=loops.mlp(dropout=0.5, bn=True))
    model = s.latest("model")
    assert model is not None
    assert model.get("first_layer") == "0" and model.get("first_layer_kind") == "Linear"
    assert [m[:3] for m in model.get("modes")] == [  # type: ignore[union-attr]
        ("1", "BatchNorm1d", True),
        ("3", "Dropout", True),
    ]
    backward = s.of("backward")
    # Every one of the first 8 steps is sampled (base.due), then fewer.
    assert [o.step for o in backward][:5] == [1, 2, 3, 4, 5]
    assert all(o.get("root") == "NllLossBackward0" for o in backward)
    assert all(
        o.get("reduction") == "mean" and o.get("probabilities_into") is None for o in backward
    )
    assert all(o.get("forwarded") is True and (o.number("reached") or 0) == 6 for o in backward)
    assert facts(s, "backward", "grads_kept")[1:] == [False] * (len(backward) - 1)
    assert set(facts(s, "pre_step", "grad_present")) == {True}
    forward = s.of("forward")
    assert {o.get("modes") for o in forward} == {(("1", True, None), ("3", True, 0.5))}
    means = [o.number("input_abs_mean") for o in forward]
    assert all(m is not None and 0.5 < m < 1.2 for m in means)
    assert set(facts(s, "batchnorm", "batch")) == {32}
    opt = s.latest("optimizer")
    assert opt is not None and opt.get("name") == "Adam" and opt.get("adaptive") is True
    assert opt.get("groups") == ((1e-3, 0.0, 1e-8, 6, "float32"),)


def test_the_order_of_zero_grad_backward_and_step(tmp_path: Path) -> None:
    _, s = loops.run(tmp_path / "a", loops.no_zero_grad)
    assert set(facts(s, "backward", "grads_kept")[1:]) == {True}
    _, s = loops.run(tmp_path / "b", loops.zero_grad_between())
    assert set(facts(s, "pre_step", "grad_present")) == {False}
    _, s = loops.run(tmp_path / "b2", loops.zero_grad_between(set_to_none=False))
    assert set(facts(s, "pre_step", "rewritten")) == {True}
    # clip_grad_value_ writes in place too (not counted as a clip): so does zero_().
    _, s = loops.run(tmp_path / "b3", loops.value_clipped)
    assert set(facts(s, "pre_step", "rewritten")) == {True}
    _, s = loops.run(tmp_path / "c", loops.step_first)
    backward = s.of("backward")
    # The first backward follows the first step, with no forward since: so does every one.
    assert {o.get("forwarded") for o in backward} == {False}
    assert all((o.number("reached") or 0) > 0 for o in backward)
    for name, loop in [
        ("d", loops.accumulate),
        ("e", loops.zero_in_place),
        ("f", loops.model_zero_grad),
        ("g", loops.clipped),
        ("h", loops.autocast(torch.float16, scaler=True)),
    ]:
        _, s = loops.run(tmp_path / name, loop)
        assert set(facts(s, "backward", "grads_kept")[1:]) == {False}, name
        assert set(facts(s, "backward", "forwarded")) == {True}, name
        assert set(facts(s, "pre_step", "grad_present")) == {True}, name
        assert set(facts(s, "pre_step", "rewritten")) == {False}, name


def test_the_loss_graph(tmp_path: Path) -> None:
    _, s = loops.run(tmp_path / "a", loops.softmax_ce)
    assert set(facts(s, "backward", "probabilities_into")) == {"cross_entropy"}
    _, s = loops.run(tmp_path / "b", loops.sigmoid_bce_logits)
    assert set(facts(s, "backward", "probabilities_into")) == {"binary_cross_entropy_with_logits"}
    _, s = loops.run(tmp_path / "c", loops.log_softmax_nll)
    assert set(facts(s, "backward", "probabilities_into")) == {None}
    _, s = loops.run(tmp_path / "d", loops.regression_sum)
    assert set(facts(s, "backward", "reduction")) == {"sum"}
    for name, loop in [("e", loops.item_loss), ("f", loops.no_grad_forward)]:
        _, s = loops.run(tmp_path / name, loop)
        assert set(facts(s, "backward", "leaf_root")) == {True}, name
        assert set(facts(s, "backward", "reached")) == {0}, name


def test_modes_batchnorm_inputs_and_precision(tmp_path: Path) -> None:
    _, s = loops.run(tmp_path / "a", loops.left_in_eval, model=loops.mlp(dropout=0.1))
    assert {o.get("modes") for o in s.of("forward")} == {(("2", False, 0.1),)}
    _, s = loops.run(tmp_path / "b", loops.with_eval_passes, model=loops.mlp(dropout=0.1))
    # The evaluation passes run under no_grad: the watch waits for the training forward.
    assert {o.get("modes") for o in s.of("forward")} == {(("2", True, 0.1),)}
    _, s = loops.run(tmp_path / "c", loops.batches_of(2), model=loops.mlp(bn=True))
    assert set(facts(s, "batchnorm", "batch")) == {2}
    _, s = loops.run(tmp_path / "d", loops.scaled_inputs(255.0))
    assert min(o.number("input_abs_mean") or 0 for o in s.of("forward")) > 100
    _, s = loops.run(tmp_path / "e", loops.autocast(torch.float16))
    assert set(facts(s, "forward", "autocast")) == {"float16"}
    assert set(facts(s, "backward", "scaled")) == {False}
    _, s = loops.run(tmp_path / "f", loops.autocast(torch.float16, scaler=True))
    assert set(facts(s, "backward", "scaled")) == {True}
    _, s = loops.run(tmp_path / "g", loops.half_params, model=loops.mlp().half())
    opt = s.latest("optimizer")
    assert opt is not None and opt.get("float16_params") == 4


def test_a_frozen_part_in_eval_is_not_read(tmp_path: Path) -> None:
    model = nn.Sequential(
        nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU()),
        nn.Linear(32, 3),
    )
    for p in model[0].parameters():
        p.requires_grad_(False)
    model[0].eval()
    _, s = loops.run(
        tmp_path,
        loops.healthy,
        model=model,
        optimizer=lambda m: torch.optim.SGD(m[1].parameters(), lr=0.1),
    )
    first = s.latest("model")
    assert first is not None and first.get("modes")[0][:3] == ("0.1", "BatchNorm1d", False)  # type: ignore[index]
    assert {o.get("modes") for o in s.of("forward")} == {()}
    assert s.of("batchnorm") == ()


def test_steps_between_samples_cost_nothing(tmp_path: Path) -> None:
    """The watch is armed at attach and by each sampled step (base.due: every one of the first
    8, then 4 a doubling of the step count up to 100 while that is denser than layer_every,
    then every layer_every) for the step that follows it."""
    _, s = loops.run(tmp_path, loops.healthy, steps=160, layer_every=50)
    steps = [o.step for o in s.of("backward")]
    assert steps[:9] == list(range(1, 10))
    assert steps[9:] == [11, 13, 15, 17, 21, 25, 29, 33, 41, 49, 51, 57, 65, 81, 97, 101, 151]


@pytest.mark.parametrize("kind", ["forward", "backward"])
def test_observations_are_plain_data(tmp_path: Path, kind: str) -> None:
    _, s = loops.run(tmp_path, loops.healthy, steps=5)
    for o in s.of(kind):
        assert isinstance(o, Observation)
        for value in o.facts.values():
            assert not isinstance(value, torch.Tensor)
