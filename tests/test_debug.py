"""Model summary and static training-bug checks, on real tiny torch models built with each bug."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from nbmonitor._engine.assemble.flow_alerts import first_non_finite, grads_never_arrived
from nbmonitor._engine.frame import Alert
from nbmonitor.debug import ModelSummary, summary
from nbmonitor.live.setup_check import check_setup


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 2)
        self.extra = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.relu(self.encoder(x)))
        return out


def by_rule(alerts: list[Alert], rule: str) -> Alert:
    found = [a for a in alerts if a.rule == rule]
    assert len(found) == 1, alerts
    return found[0]


# -- check_setup ---------------------------------------------------------------------------------


def test_correct_setup_has_no_findings() -> None:
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert check_setup(model, opt) == []
    assert check_setup(model, None) == []


def test_parameter_missing_from_optimizer() -> None:
    model = Net()
    params: list[torch.Tensor] = [*model.encoder.parameters(), *model.head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)  # forgot model.extra
    alert = by_rule(check_setup(model, opt, step=0, time=5.0), "params_not_in_optimizer")
    assert alert.layers == ("extra.weight", "extra.bias")
    assert "extra.weight, extra.bias" in alert.message
    assert alert.step == 0 and alert.time == 5.0


def test_frozen_parameter_in_optimizer() -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.encoder.weight.requires_grad_(False)  # frozen after building the optimizer
    alerts = check_setup(model, opt)
    assert [a.rule for a in alerts] == ["frozen_params_in_optimizer"]
    assert alerts[0].layers == ("encoder.weight",)


def test_lr_zero_group_names_group_and_params() -> None:
    model = Net()
    groups: list[dict[str, Any]] = [
        {"params": model.encoder.parameters()},
        {"params": [*model.head.parameters(), *model.extra.parameters()], "lr": 0.0},
    ]
    opt = torch.optim.SGD(groups, lr=0.1)
    alert = by_rule(check_setup(model, opt), "lr_zero")
    assert alert.layers == ("head.weight", "head.bias", "extra.weight", "extra.bias")
    assert "Param group 1" in alert.message


def test_lr_zero_during_scheduler_warmup_is_not_a_bug() -> None:
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda step: step / 100)  # warmup from lr 0
    assert opt.param_groups[0]["lr"] == 0.0
    assert check_setup(model, opt) == []


def test_duplicate_parameter_added_to_a_second_group_after_construction() -> None:
    model = Net()
    opt = torch.optim.SGD(
        [{"params": model.encoder.parameters()}, {"params": model.head.parameters()}],
        lr=0.1,
    )
    opt.add_param_group({"params": model.extra.parameters()})
    opt.param_groups[1]["params"].append(model.encoder.weight)  # torch only checks at construction
    alert = by_rule(check_setup(model, opt), "duplicate_params")
    assert alert.layers == ("encoder.weight",)
    assert "encoder.weight in groups 0 and 1" in alert.message
    assert alert.severity == "error"


# -- runtime helpers -----------------------------------------------------------------------------


def test_a_model_without_parameters_is_said_at_attach(tmp_path) -> None:
    import nbmonitor

    class Doubler(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * x

    (alert,) = check_setup(Doubler(), None)
    assert alert.rule == "model_without_parameters" and "Doubler" in alert.message
    with nbmonitor.attach(Doubler(), run_dir=tmp_path, display=False) as mon:
        mon.flush()
        assert [e.rule for e in mon.events()] == ["model_without_parameters"]


def test_grads_never_arrived_names_the_detached_branch() -> None:
    model = Net()
    names = [n for n, _ in model.named_parameters()]
    loss = model(torch.randn(3, 4)).sum() + model.extra(torch.randn(3, 8)).detach().sum()
    loss.backward()
    seen = np.array([p.grad is not None for p in model.parameters()])
    alert = grads_never_arrived(names, seen, step=20, time=1.0)
    assert alert is not None
    assert alert.rule == "gradient_not_flowing"
    assert alert.layers == ("extra.weight", "extra.bias")
    assert "after 20 steps" in alert.message and "extra.weight, extra.bias" in alert.message
    assert grads_never_arrived(names, np.ones(len(names), dtype=bool), step=20, time=1.0) is None


def test_first_non_finite_in_parameter_order() -> None:
    names = ["a", "b", "c", "d", "e", "f", "g"]
    norms = np.array([1.0, np.nan, 2.0, np.inf, np.nan, -np.inf, np.nan])
    assert first_non_finite(names, norms) == ["b", "d", "e", "f", "g"]
    assert first_non_finite(names, norms, limit=2) == ["b", "d"]
    with pytest.raises(ValueError, match="shape"):
        first_non_finite(names, norms[:3])


# -- summary -------------------------------------------------------------------------------------


def test_summary_counts_trainable_frozen_and_dtype() -> None:
    model = Net()
    model.extra.requires_grad_(False)
    model.head.to(torch.bfloat16)
    s = summary(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    assert [r["module"] for r in s.rows] == ["encoder", "head", "extra"]
    assert s.rows[2] == {
        "module": "extra",
        "type": "Linear",
        "params": 72,
        "trainable": 0,
        "frozen": 72,
    }
    assert (s.total_params, s.trainable_params, s.frozen_params) == (130, 58, 72)
    assert s.by_dtype["float32"] == {
        "params": 40 + 72,
        "param_bytes": 4 * 112,
        "grad_bytes": 4 * 40,  # the frozen extra has no gradient
        "optimizer_bytes": 4 * 40,  # one momentum buffer per trainable parameter
    }
    assert s.by_dtype["bfloat16"] == {
        "params": 18,
        "param_bytes": 2 * 18,
        "grad_bytes": 2 * 18,
        "optimizer_bytes": 2 * 18,
    }


def test_optimizer_state_estimates() -> None:
    model = torch.nn.Linear(10, 10)  # 110 float32 params = 440 bytes
    adam = summary(model, torch.optim.Adam(model.parameters()))
    amsgrad = summary(model, torch.optim.Adam(model.parameters(), amsgrad=True))
    sgd_m = summary(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    sgd = summary(model, torch.optim.SGD(model.parameters(), lr=0.1))
    rms = summary(model, torch.optim.RMSprop(model.parameters(), momentum=0.9, centered=True))
    default = summary(model)

    def opt_bytes(s: ModelSummary) -> int | None:
        return s.by_dtype["float32"]["optimizer_bytes"]

    assert [opt_bytes(s) for s in (adam, amsgrad, sgd_m, sgd, rms)] == [880, 1320, 440, 0, 1320]
    assert opt_bytes(default) == 880 and "AdamW assumed" in default.optimizer
    assert "estimate for Adam" in adam.optimizer


def test_optimizer_state_is_measured_once_it_exists() -> None:
    model = torch.nn.Linear(10, 10)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 10)).sum().backward()
    opt.step()
    s = summary(model, opt)
    # exp_avg + exp_avg_sq (440 bytes each) + a float32 step counter per parameter tensor
    assert s.by_dtype["float32"]["optimizer_bytes"] == 880 + 2 * 4
    assert s.optimizer == "measured from Adam.state"


def test_unknown_optimizer_says_unknown() -> None:
    class Custom(torch.optim.Optimizer):
        def __init__(self, params) -> None:  # type: ignore[no-untyped-def]
            super().__init__(params, {"lr": 0.1})

    model = torch.nn.Linear(3, 3)
    s = summary(model, Custom(model.parameters()))
    assert s.by_dtype["float32"]["optimizer_bytes"] is None
    assert "unknown" in s.optimizer and s.total_bytes() is None
    assert "unknown" in str(s)


def test_lora_style_adapter_is_detected_and_described() -> None:
    class LoRALinear(torch.nn.Module):
        def __init__(self, n: int, rank: int) -> None:
            super().__init__()
            self.base = torch.nn.Linear(n, n)
            self.base.requires_grad_(False)
            self.lora_a = torch.nn.Linear(n, rank, bias=False)
            self.lora_b = torch.nn.Linear(rank, n, bias=False)
            torch.nn.init.zeros_(self.lora_b.weight)

    model = torch.nn.Sequential(LoRALinear(256, 4), LoRALinear(256, 4))
    s = summary(model)
    assert s.frozen_params == 2 * (256 * 256 + 256)
    assert s.trainable_params == 2 * (2 * 256 * 4)
    assert s.adapter
    assert s.adapter_text == "frozen base 132K params + trainable adapter 4.1K params (3.0%)"
    assert s.adapter_text in str(s) and s.adapter_text in s._repr_html_()
    assert not summary(torch.nn.Linear(4, 4)).adapter


def test_text_html_and_dataframe_contain_the_numbers() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(1000, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 5)
    )
    s = summary(model)
    text, page = str(s), s._repr_html_()
    for out in (text, page):
        assert "1,006,005" in out  # total params
        assert "1,001,000" in out and "5,005" in out  # per module
        assert "3.8 MiB" in out  # float32 parameter memory
        assert "7.7 MiB" in out  # AdamW state estimate
    assert "<table" in page and "<td><code>0</code></td>" in page
    frame = s.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == ["module", "type", "params", "trainable", "frozen"]
    assert frame["params"].tolist() == [1_001_000, 5_005]


def test_tied_parameters_count_once() -> None:
    emb = torch.nn.Embedding(10, 4)
    out = torch.nn.Linear(4, 10, bias=False)
    out.weight = emb.weight
    s = summary(torch.nn.Sequential(emb, out))
    assert s.total_params == 40
    assert [r["module"] for r in s.rows] == ["0"]
