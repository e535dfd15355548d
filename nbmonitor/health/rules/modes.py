"""The modules whose train() and eval() compute differently (dropout, BatchNorm), as the
training side read them in the training forwards of sampled steps (``_capture/probes/
structure.py``): left in eval() while the optimizer steps, BatchNorm fed a batch too small for
its statistics, dropout that drops nearly everything. Only modules in a part that trains are
read (a frozen backbone left in eval() on purpose is not)."""

from __future__ import annotations

from nbmonitor.health.alert import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.health.doc import CAUSE, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, clear, nothing
from nbmonitor.health.structure import Observation, Structure, observed, steady
from nbmonitor.health.view import HealthView

LEAST = 2
RECENT = 4
# BatchNorm's batch statistics from this few samples are mostly noise (each normalised value
# of a batch of 2 is ±1), and differ from the running statistics eval() uses; the GroupNorm
# paper (Wu & He, 2018) shows BatchNorm's error rising steeply from a batch of 4 down.
TINY_BATCH = 4
# A dropout rate this high keeps fewer than one unit in five and scales the rest by 5 or more.
DROPOUT_HIGH = 0.8


def _when(since: int | None, obs: tuple[Observation, ...], view: HealthView) -> int:
    """Where the streak of observations reached its count, never past the newest row."""
    newest = int(view.step_col[-1]) if view.step_col.size else obs[-1].step
    return min(since if since is not None else obs[-1].step, newest)


def _params(structure: Structure, modules: list[str]) -> tuple[str, ...]:
    """The parameter names of ``modules`` (from the model's facts), so that an alert naming
    them covers the symptoms seen on their parameters."""
    model = structure.latest("model")
    modes = model.get("modes") if model is not None else None
    out: list[str] = []
    for entry in modes if isinstance(modes, tuple) else ():
        if isinstance(entry, tuple) and len(entry) >= 4 and entry[0] in modules:
            out.extend(p for p in entry[3] if isinstance(p, str))
    return tuple(out)


def _modes(o: Observation) -> list[tuple[str, bool, float | None]]:
    found = o.get("modes")
    out: list[tuple[str, bool, float | None]] = []
    for entry in found if isinstance(found, tuple) else ():
        if isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], str):
            p = entry[2]
            out.append((entry[0], entry[1] is True, float(p) if isinstance(p, float) else None))
    return out


class EvalModeDuringTraining(Base):
    name = "eval_mode_during_training"
    explains = ("loss_plateau", "update_ratio_low", "batchnorm_tiny_batch")
    doc = RuleDoc(
        CAUSE,
        names="the model (or a part with dropout/BatchNorm) is left in `eval()` while the "
        "optimizer steps",
        evidence="`module.training` is False for the dropout/BatchNorm modules of a part that "
        "trains, in the training (grad-enabled) forward of every sampled step",
        fix="call `model.train()` before the training steps (after each evaluation pass)",
        silent_on=(
            "evaluation passes (`model.eval()` + `no_grad`, then `model.train()`)",
            "a frozen part left in `eval()` (its parameters do not train)",
            "a model with no dropout or BatchNorm",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        seen = observed(view, "forward", RECENT, LEAST, key="modes", keep=_modes)
        if seen is None:
            return nothing(self.name)
        structure, obs = seen

        def in_eval(o: Observation) -> list[str]:
            return [name for name, training, _ in _modes(o) if not training]

        def held(o: Observation) -> bool:
            return bool(in_eval(o))

        if not steady(obs, LEAST, held):
            return clear(self.name)
        names = in_eval(obs[-1])
        total = len(_modes(obs[-1]))
        step = _when(structure.held_since("forward", "modes", LEAST, held), obs, view)
        whole = len(names) == total

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause=(
                        "the model is left in `eval()` while the optimizer steps"
                        if whole
                        else "part of the model is left in `eval()` while the optimizer steps"
                    ),
                    said=f"{len(names)} of its {total} dropout/BatchNorm modules were in eval "
                    f"mode in the training forward, on {len(obs)} sampled steps",
                    evidence={
                        "modules_in_eval": names,
                        "modules": total,
                        "steps": [o.step for o in obs],
                    },
                    fix="call `model.train()` before the training steps (after each evaluation "
                    "pass)",
                    layers=(*names, *_params(structure, names)),
                    place=names[0],
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


class BatchnormTinyBatch(Base):
    name = "batchnorm_tiny_batch"
    explains = (
        "loss_plateau",
        "loss_spike",
        "gradient_spike",
        "exploding_gradients",
        "update_ratio_high",
    )
    doc = RuleDoc(
        CAUSE,
        names="BatchNorm in training mode is fed a batch too small for its statistics",
        evidence=f"the input of the first BatchNorm in training mode has at most {TINY_BATCH} "
        "samples (its shape's first dimension), on every sampled step",
        fix="train with a larger batch, or use `GroupNorm`/`LayerNorm` instead of BatchNorm",
        silent_on=(
            "BatchNorm with batch 32",
            "evaluation passes with batch 1 under `no_grad`",
            "BatchNorm left in `eval()` with frozen weights",
        ),
    )

    def check(self, view: HealthView) -> Outcome:
        seen = observed(view, "batchnorm", RECENT, LEAST, key="batch")
        if seen is None:
            return nothing(self.name)
        structure, obs = seen

        def tiny(o: Observation) -> bool:
            batch = o.number("batch")
            return batch is not None and batch <= TINY_BATCH

        if not steady(obs, LEAST, tiny):
            return clear(self.name)
        module = str(obs[-1].get("module"))
        batch = int(obs[-1].number("batch") or 0)
        step = _when(structure.held_since("batchnorm", "batch", LEAST, tiny), obs, view)

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause=f"BatchNorm ({obs[-1].get('kind')}) is fed {batch} sample"
                    f"{'s' if batch != 1 else ''} a forward in training mode: its batch "
                    "statistics are mostly noise",
                    said=f"batch {batch} at module {module}, on {len(obs)} sampled steps; "
                    f"{obs[-1].get('per_channel')} values per channel",
                    evidence={
                        "module": module,
                        "batch": batch,
                        "values_per_channel": obs[-1].get("per_channel"),
                        "steps": [o.step for o in obs],
                    },
                    fix="train with a larger batch (16 or more), or use `GroupNorm`/`LayerNorm` "
                    "instead of BatchNorm",
                    layers=(module, *_params(structure, [module])),
                    place=module,
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


class DropoutTooHigh(Base):
    name = "dropout_too_high"
    explains = ("dead_units", "loss_plateau", "update_ratio_low", "vanishing_gradients")
    doc = RuleDoc(
        CAUSE,
        names="a Dropout's `p` is far too high: it drops nearly every unit",
        evidence=f"a Dropout in training mode has `p` ≥ {DROPOUT_HIGH} (it keeps fewer than one "
        "unit in five), on every sampled step",
        fix="lower `p` (0.1-0.5 is usual)",
        silent_on=("dropout 0.5", "dropout in `eval()` (it is then off)"),
    )

    def check(self, view: HealthView) -> Outcome:
        seen = observed(view, "forward", RECENT, LEAST, key="modes", keep=_modes)
        if seen is None:
            return nothing(self.name)
        structure, obs = seen

        def high(o: Observation) -> dict[str, float]:
            return {
                name: p
                for name, training, p in _modes(o)
                if training and p is not None and p >= DROPOUT_HIGH
            }

        def held(o: Observation) -> bool:
            return bool(high(o))

        if not steady(obs, LEAST, held):
            return clear(self.name)
        found = high(obs[-1])
        names = list(found)
        step = _when(structure.held_since("forward", "modes", LEAST, held), obs, view)
        worst = max(found.values())

        def make(_new: list[str]) -> list[Alert]:
            return [
                cause_alert(
                    self.name,
                    cause=f"Dropout with p={worst:g} drops nearly every unit",
                    said=f"{len(names)} Dropout module(s) with p ≥ {DROPOUT_HIGH}: "
                    + ", ".join(f"{n} (p={p:g})" for n, p in list(found.items())[:4])
                    + f"; it keeps {1 - worst:.0%} of the units and scales them by "
                    f"{1 / max(1 - worst, 1e-9):.3g}",
                    evidence={
                        "modules": names,
                        "p": list(found.values()),
                        "steps": [o.step for o in obs],
                    },
                    fix="lower the dropout rate `p` (0.1-0.5 is usual)",
                    layers=tuple(names),
                    place=names[0],
                    step=step,
                    time=view.time_at(step),
                )
            ]

        return Outcome(self.name, [""], always, make)


__all__ = ["BatchnormTinyBatch", "DropoutTooHigh", "EvalModeDuringTraining"]
