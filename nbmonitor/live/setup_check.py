"""Training-setup mistakes found once, at attach, from the model and the optimizer alone:
a model without parameters, parameters missing from the optimizer, frozen ones inside it, one
parameter in two groups, groups whose learning rate is 0. Reported as alerts (subject ``setup``)."""

from __future__ import annotations

import time as _time

import torch

from nbmonitor.health import alert as subjects
from nbmonitor.health.adapters import Adapters
from nbmonitor.health.alert import Alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rules.finetune import setup_explained
from nbmonitor.health.wording import MAX_NAMED, name_list


def check_setup(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int = 0,
    time: float | None = None,
    adapters: Adapters | None = None,
) -> list[Alert]:
    """Training bugs visible before the first step, as alerts naming the parameters.

    Rules: ``model_without_parameters``, ``params_not_in_optimizer``,
    ``frozen_params_in_optimizer``, ``lr_zero`` and ``duplicate_params``. With ``adapters`` (a
    fine-tune), the parameters that the health rules ``adapters_not_trained`` and
    ``base_not_frozen`` name (with their own fix) are left out of the generic two, and a
    frozen base in the optimizer is on purpose.
    Parameter names are model.named_parameters() names.
    """
    when = _time.time() if time is None else time
    if next(iter(model.parameters()), None) is None:
        return [
            Alert(
                "model_without_parameters",
                "warning",
                f"The model ({type(model).__name__}) has no parameters: nothing in it trains, "
                "so there are no gradients, updates or layers to watch, only the steps an "
                "optimizer takes and the system. Attach the module that holds the weights "
                "(the one whose parameters() the optimizer was given).",
                step,
                when,
                subject=subjects.SETUP,
            )
        ]
    if optimizer is None:
        return []
    explained = setup_explained(adapters) if adapters is not None else set()
    names = {id(p): n for n, p in model.named_parameters()}
    params_in_groups: list[list[torch.Tensor]] = [list(g["params"]) for g in optimizer.param_groups]

    def name_of(p: torch.Tensor, group: int, index: int) -> str:
        return names.get(id(p), f"param_groups[{group}][{index}]")

    alerts: list[Alert] = []
    in_optimizer = {id(p) for params in params_in_groups for p in params}

    missing = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad and id(p) not in in_optimizer and n not in explained
    ]
    if missing:
        alerts.append(
            Alert(
                "params_not_in_optimizer",
                "warning",
                f"{len(missing)} trainable parameter(s) are not in the optimizer and will never "
                f"be updated: {name_list(missing)}. Build the optimizer from model.parameters() "
                "after adding every module (or add a param group for them).",
                step,
                when,
                tuple(missing),
                subject=subjects.SETUP,
            )
        )

    frozen: list[str] = []
    places: dict[int, list[int]] = {}
    first_name: dict[int, str] = {}
    for g, params in enumerate(params_in_groups):
        for i, p in enumerate(params):
            key = id(p)
            # Beside adapters, a frozen tensor in the optimizer is the base, frozen on
            # purpose (AdamW(model.parameters()) on a peft model skips it), or an adapter
            # that adapters_not_trained names.
            if key not in places and not p.requires_grad and adapters is None:
                frozen.append(name_of(p, g, i))
            places.setdefault(key, []).append(g)
            first_name.setdefault(key, name_of(p, g, i))
    if frozen:
        alerts.append(
            Alert(
                "frozen_params_in_optimizer",
                "warning",
                f"{len(frozen)} frozen parameter(s) (requires_grad=False) are in the optimizer: "
                f"{name_list(frozen)}. They get no gradient so they do not train; if they should, "
                "set requires_grad=True, otherwise leave them out of the optimizer.",
                step,
                when,
                tuple(frozen),
                subject=subjects.SETUP,
            )
        )

    for g, group in enumerate(optimizer.param_groups):
        lr = group.get("lr")
        if isinstance(lr, torch.Tensor):
            lr = float(lr.detach().cpu()) if lr.numel() == 1 else None
        # A scheduler in warmup (or at the end of a decay to 0) has lr == 0 on purpose; it
        # records the group's real learning rate as initial_lr.
        initial = group.get("initial_lr")
        if isinstance(initial, torch.Tensor):
            initial = float(initial.detach().cpu()) if initial.numel() == 1 else None
        scheduled = isinstance(initial, (int, float)) and initial > 0
        if isinstance(lr, (int, float)) and lr == 0 and not scheduled:
            group_names = [name_of(p, g, i) for i, p in enumerate(params_in_groups[g])]
            alerts.append(
                Alert(
                    "lr_zero",
                    "warning",
                    f"Param group {g} has learning rate 0, so its parameters never change: "
                    f"{name_list(group_names)}. Set its lr (or freeze them deliberately with "
                    "requires_grad=False).",
                    step,
                    when,
                    tuple(group_names),
                    subject=subjects.SETUP,
                )
            )

    duplicated = [key for key, groups in places.items() if len(groups) > 1]
    if duplicated:
        dup_names = [first_name[key] for key in duplicated]
        where = "; ".join(
            f"{first_name[key]} {_placement(places[key])}" for key in duplicated[:MAX_NAMED]
        )
        if len(duplicated) > MAX_NAMED:
            where += f"; and {len(duplicated) - MAX_NAMED} more"
        alerts.append(
            Alert(
                "duplicate_params",
                "error",
                f"{len(duplicated)} parameter(s) appear more than once in the optimizer "
                f"({where}): they are updated twice per step. Keep each parameter in exactly "
                "one param group.",
                step,
                when,
                tuple(dup_names),
                subject=subjects.SETUP,
            )
        )
    return alerts


def _placement(groups: list[int]) -> str:
    """'in groups 0 and 1', or 'twice in group 0'."""
    distinct = sorted(set(groups))
    if len(distinct) == 1:
        return f"{len(groups)} times in group {distinct[0]}"
    return "in groups " + ", ".join(map(str, distinct[:-1])) + f" and {distinct[-1]}"


# This module's alerts in the table of causes (docs/diagnosis.md, benchmarks/diagnosis/table.py).
DOCS = {
    "params_not_in_optimizer": RuleDoc(
        CAUSE,
        "trainable parameters the optimizer does not hold: they get gradients but never change",
        "the model's parameters that require grad against the optimizer's groups, at attach",
        "build the optimizer from `model.parameters()` after adding every module",
        ("adapters on a frozen base (named by the fine-tune rules)",),
    ),
    "frozen_params_in_optimizer": RuleDoc(
        CAUSE,
        "parameters with `requires_grad=False` inside the optimizer: they never change",
        "the optimizer's parameters that do not require grad, at attach",
        "leave frozen parameters out of the optimizer (or unfreeze them)",
        ("a frozen base in a fine-tune's optimizer, on purpose",),
    ),
    "lr_zero": RuleDoc(
        CAUSE,
        "a param group's learning rate is 0: its parameters never change",
        "each group's `lr` at attach",
        "set the group's learning rate",
        ("a schedule that ends near 0",),
    ),
    "duplicate_params": RuleDoc(
        CAUSE,
        "a parameter appears more than once in the optimizer: it is updated twice per step",
        "the parameters of every group, at attach",
        "give each parameter to one group only",
    ),
}
