"""Structural evidence, read without a sync: what the model, the optimizer, the loss's autograd
graph and the loop's order of ``zero_grad``/``backward``/``step`` are.

Once at attach: the modules whose train/eval differs (dropout, BatchNorm) and which of them sit
in a part that trains, the first layer, the softmax/sigmoid modules, the parameters' dtypes
(``model_facts``); when an optimizer becomes the monitor's: its class and each group's options
and dtypes (``optimizer_facts``, called by the clock).

On a sampled step (``base.due``), and at attach, the probe *arms* a one-step watch, which acts
once and disarms itself, so that the steps between cost nothing:

- a forward pre-hook on the first layer (removed when it fires, in the next grad-enabled
  forward): the modes and dropout rates of those modules, float16 autocast, and the first
  layer's input scale (an on-device abs-mean and abs-max, read later by the sampler);
- a forward pre-hook on the first BatchNorm in training mode: the batch it is fed (a shape);
- the next backward's start (``StepClock.backward_called``): a walk of a few hundred nodes of
  the loss's graph from its root (a softmax feeding log-softmax/NLL, a sigmoid feeding
  BCE-with-logits, the loss node's reduction, whether any parameter is reached at all), and,
  by identity and in-place version (no sync), whether a watched parameter's ``.grad`` is the
  very tensor left by the last step (never reset: ``zero_grad`` forgotten) and whether a
  forward ran since that step (none: ``step()`` came before this ``backward()``);
- that step's ``optimizer.step()`` start: whether the gradient the backward left is still
  there (gone: reset between ``backward()`` and ``step()``).
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from nbmonitor._capture.device_value import DeviceValue
from nbmonitor._capture.probes.base import ProbeBase, StepContext, due
from nbmonitor.errors import Guard
from nbmonitor.records import Fact, StructureRecord

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

# The nodes of the loss's graph walked at most: the loss nodes sit next to the root, and a
# parameter is reached within a few dozen nodes in any model; the bound keeps a huge graph's
# walk short (then "complete" is False and no "not connected" verdict is drawn).
NODE_LIMIT = 512

# Nodes that only reshape or move values: a softmax seen through them still feeds the loss.
_VIEWS = frozenset(
    {
        "ViewBackward0",
        "ReshapeAliasBackward0",
        "UnsafeViewBackward0",
        "PermuteBackward0",
        "TransposeBackward0",
        "TransposeBackward1",
        "TBackward0",
        "CloneBackward0",
        "ToCopyBackward0",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
        "UnsqueezeBackward0",
        "SelectBackward0",
        "SliceBackward0",
        "ExpandBackward0",
        "IndexBackward0",
        "AsStridedBackward0",
        "FlattenBackward0",
    }
)
# A loss that expects logits or log-probabilities, and what must not feed it.
_WANTS_LOGITS = {
    "LogSoftmaxBackward0": ("SoftmaxBackward0", "cross_entropy"),
    "NllLossBackward0": ("SoftmaxBackward0", "nll_loss"),
    "NllLoss2DBackward0": ("SoftmaxBackward0", "nll_loss"),
    "BinaryCrossEntropyWithLogitsBackward0": (
        "SigmoidBackward0",
        "binary_cross_entropy_with_logits",
    ),
}
# Loss nodes whose reduction is saved on the node (ATen's Reduction: 0 none, 1 mean, 2 sum).
_LOSS_NODES = frozenset(
    {
        "MseLossBackward0",
        "NllLossBackward0",
        "NllLoss2DBackward0",
        "BinaryCrossEntropyBackward0",
        "BinaryCrossEntropyWithLogitsBackward0",
        "L1LossBackward0",
        "SmoothL1LossBackward0",
        "HuberLossBackward0",
        "KlDivBackward0",
    }
)
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}

# Modules whose train() and eval() compute differently.
_MODE_KINDS: tuple[type[nn.Module], ...] = (
    nn.modules.dropout._DropoutNd,  # noqa: SLF001
    nn.modules.batchnorm._BatchNorm,  # noqa: SLF001
)
# A first layer that normalises its own input, or takes indices: its input scale is no fault.
_SCALE_FREE: tuple[type[nn.Module], ...] = (
    nn.Embedding,
    nn.EmbeddingBag,
    nn.modules.batchnorm._NormBase,  # noqa: SLF001
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)
# Optimizers that divide by a running second moment (eps underflows in float16).
ADAPTIVE = frozenset(
    {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "RMSprop", "Adadelta", "SparseAdam"}
)


def _kind(module: nn.Module) -> str:
    return type(module).__name__


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_cuda:
        return float(value.detach())
    return None


def optimizer_facts(
    optimizer: torch.optim.Optimizer, names: dict[int, str], step: int
) -> StructureRecord:
    """The optimizer's class and, per param group: lr, weight_decay, eps, parameters, and the
    names of its float16 parameters (a few). Read from the groups, no device work."""
    groups: list[Fact] = []
    half: list[str] = []
    for g, group in enumerate(optimizer.param_groups):
        params = list(group.get("params", ()))
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
        for i, p in enumerate(params):
            if p.dtype == torch.float16 and len(half) < 8:
                half.append(names.get(id(p), f"param_groups[{g}][{i}]"))
        eps = group.get("eps")
        groups.append(
            (
                _number(group.get("lr")),
                _number(group.get("weight_decay")),
                _number(eps[0] if isinstance(eps, tuple) else eps),
                len(params),
                ",".join(dtypes),
            )
        )
    n_half = sum(
        1
        for group in optimizer.param_groups
        for p in group.get("params", ())
        if p.dtype == torch.float16
    )
    facts: tuple[tuple[str, Fact], ...] = (
        ("name", type(optimizer).__name__),
        ("adaptive", type(optimizer).__name__ in ADAPTIVE),
        ("groups", tuple(groups)),
        ("float16_params", n_half),
        ("float16_names", tuple(half)),
    )
    return StructureRecord(step, "optimizer", facts)


class StructureProbe(ProbeBase):
    """The one-step watches (see the module's docstring); ``StepClock`` calls
    ``backward_started``, ``pre_step_started`` and ``loss_scaled`` while they are armed."""

    name = "structure"
    sampled = True

    def __init__(self, guard: Guard, model: nn.Module, every: int) -> None:
        super().__init__(guard)
        self.every = every
        self._model = weakref.ref(model)
        self._ctx: StepContext | None = None
        self._optimizer: Any = lambda: None  # the clock's optimizer, read when needed
        self.backward_armed = False  # the next backward's start is watched
        self.pre_step_armed = False  # the next optimizer.step()'s start is watched
        self.scaled = False  # a GradScaler scaled a loss since the watch was armed
        # The armed forward pre-hooks, by what they read ("first", "batchnorm").
        self._handles: dict[str, RemovableHandle] = {}
        # Model facts, read at install.
        self._modes: list[tuple[str, weakref.ref[nn.Module], bool]] = []  # name, module, counts
        self._first: tuple[str, weakref.ref[nn.Module], bool] | None = None  # scale read?
        self._param_ids: frozenset[int] = frozenset()
        self._opt_ids: frozenset[int] = frozenset()
        self._opt_key: tuple[int, int] = (0, -1)
        # The gradient the last step left on a watched parameter: (parameter, gradient,
        # version), all but the version weakly.
        self._watched: weakref.ref[torch.Tensor] | None = None
        self._left: tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor], int] | None = None
        self._pre_param: weakref.ref[torch.Tensor] | None = None
        self._accumulated = -1  # the watched gradient's version after the backward

    # -- setup ----------------------------------------------------------------------------------

    def bind(self, ctx: StepContext, optimizer: Any) -> None:
        """The clock's context and a function returning its optimizer (adopted later maybe)."""
        self._ctx = ctx
        self._optimizer = optimizer

    def events(self) -> tuple[str, ...]:
        return ("post_step",)

    def install(self, model: nn.Module) -> list[RemovableHandle]:
        self._read_model(model)
        self._arm()
        return []

    def close(self) -> None:
        self._disarm_hooks()
        self.backward_armed = self.pre_step_armed = False

    def _read_model(self, model: nn.Module) -> None:
        modules = dict(model.named_modules())
        trains: dict[str, bool] = {}

        def part_trains(name: str) -> bool:
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            if parent not in trains:
                owner = modules.get(parent, model)
                trains[parent] = any(p.requires_grad for p in owner.parameters())
            return trains[parent]

        modes: list[Fact] = []
        softmax: list[str] = []
        sigmoid: list[str] = []
        first: tuple[str, nn.Module] | None = None
        for name, module in modules.items():
            if isinstance(module, _MODE_KINDS):
                own = [p for p in module.parameters(recurse=False)]
                # A BatchNorm whose own weights are frozen, or any such module in a part that
                # does not train, is left in eval() on purpose (a frozen backbone).
                counts = any(p.requires_grad for p in own) if own else part_trains(name)
                self._modes.append((name, weakref.ref(module), counts))
                owned = tuple(
                    f"{name}.{n}" if name else n for n, _ in module.named_parameters(recurse=False)
                )
                modes.append((name, _kind(module), counts, owned))
            if isinstance(module, nn.Softmax | nn.LogSoftmax):
                softmax.append(name)
            elif isinstance(module, nn.Sigmoid):
                sigmoid.append(name)
            if (
                first is None
                and next(module.children(), None) is None
                and next(module.parameters(recurse=False), None) is not None
            ):
                first = (name, module)
        if first is not None:
            name, module = first
            self._first = (name, weakref.ref(module), not isinstance(module, _SCALE_FREE))
        params = list(model.parameters())
        self._param_ids = frozenset(id(p) for p in params)
        dtypes: dict[str, int] = {}
        for p in params:
            key = str(p.dtype).removeprefix("torch.")
            dtypes[key] = dtypes.get(key, 0) + 1
        facts: tuple[tuple[str, Fact], ...] = (
            ("modes", tuple(modes)),
            ("first_layer", first[0] if first else None),
            ("first_layer_kind", _kind(first[1]) if first else None),
            (
                "first_layer_params",
                tuple(
                    f"{first[0]}.{n}" if first[0] else n
                    for n, _ in first[1].named_parameters(recurse=False)
                )
                if first
                else (),
            ),
            ("softmax_modules", tuple(softmax)),
            ("sigmoid_modules", tuple(sigmoid)),
            ("dtypes", tuple(sorted(dtypes.items()))),
            ("modules", len(modules)),
        )
        self._put(StructureRecord(self._step(), "model", facts))

    # -- arming ---------------------------------------------------------------------------------

    def post_step(self, ctx: StepContext) -> None:
        if due(ctx.step + 1, self.every):
            self._arm()

    def _step(self) -> int:
        """The step in progress (1-based)."""
        return self._ctx.step + 1 if self._ctx is not None else 1

    def _put(self, record: StructureRecord) -> None:
        if self._ctx is not None:
            self._ctx.recorder.put(record)

    def _arm(self) -> None:
        self.backward_armed = True
        self.pre_step_armed = False
        self.scaled = False
        self._left = None
        watched = self._watched() if self._watched is not None else None
        if watched is None:
            watched = self._first_optimized()
        if watched is not None and watched.grad is not None:
            grad = watched.grad
            self._left = (weakref.ref(watched), weakref.ref(grad), grad._version)  # noqa: SLF001
        self._disarm_hooks()
        if self._first is not None:
            module = self._first[1]()
            if module is not None:
                self._handles["first"] = module.register_forward_pre_hook(self._first_forward)
        for _, ref, counts in self._modes:
            module = ref()
            if (
                counts
                and module is not None
                and module.training
                and isinstance(module, nn.modules.batchnorm._BatchNorm)  # noqa: SLF001
            ):
                self._handles["batchnorm"] = module.register_forward_pre_hook(
                    self._batchnorm_forward
                )
                break

    def _disarm_hooks(self) -> None:
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()

    def _optimizer_ids(self) -> frozenset[int]:
        optimizer = self._optimizer()
        if optimizer is None:
            return frozenset()
        key = (id(optimizer), len(optimizer.param_groups))
        if key != self._opt_key:
            self._opt_key = key
            self._opt_ids = frozenset(
                id(p) for group in optimizer.param_groups for p in group.get("params", ())
            )
        return self._opt_ids

    def _first_optimized(self) -> torch.Tensor | None:
        optimizer = self._optimizer()
        if optimizer is None:
            return None
        for group in optimizer.param_groups:
            for p in group.get("params", ()):
                if p.grad is not None:
                    return p  # type: ignore[no-any-return]
        return None

    # -- the one-shot forward hooks ---------------------------------------------------------------

    def _first_forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if not torch.is_grad_enabled() or not self.guard.on:
            return  # an evaluation pass: the watch waits for a training forward
        try:
            self._read_forward(args)
        except Exception as exc:
            self.guard.failed(exc)
        finally:
            self._drop_hook("first")

    def _read_forward(self, args: tuple[Any, ...]) -> None:
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        device = x.device.type if x is not None else "cpu"
        autocast = None
        if torch.is_autocast_enabled(device):
            autocast = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
        modes: list[Fact] = []
        for name, ref, counts in self._modes:
            m = ref()
            if m is not None and counts:
                p = getattr(m, "p", None)
                modes.append((name, bool(m.training), float(p) if isinstance(p, float) else None))
        facts: list[tuple[str, Fact]] = [
            ("modes", tuple(modes)),
            ("autocast", autocast),
            ("device", device),
        ]
        value = None
        keys: tuple[str, ...] = ()
        first = self._first
        if (
            first is not None
            and first[2]
            and x is not None
            and x.is_floating_point()
            and x.numel() > 0
        ):
            a = x.detach().abs()
            value = DeviceValue(torch.stack((a.mean(), a.amax())).to(torch.float32))
            keys = ("input_abs_mean", "input_abs_max")
            facts.append(("first_layer", first[0]))
            facts.append(("input_shape", tuple(int(d) for d in x.shape)))
        self._put(StructureRecord(self._step(), "forward", tuple(facts), value, keys))

    def _batchnorm_forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if not torch.is_grad_enabled() or not self.guard.on:
            return
        try:
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if x is not None and x.dim() >= 2 and module.training:
                name = next(n for n, ref, _ in self._modes if ref() is module)
                per_channel = x.numel() // max(int(x.shape[1]), 1)
                facts: tuple[tuple[str, Fact], ...] = (
                    ("module", name),
                    ("kind", _kind(module)),
                    ("batch", int(x.shape[0])),
                    ("per_channel", int(per_channel)),
                )
                self._put(StructureRecord(self._step(), "batchnorm", facts))
        except Exception as exc:
            self.guard.failed(exc)
        finally:
            self._drop_hook("batchnorm")

    def _drop_hook(self, which: str) -> None:
        handle = self._handles.pop(which, None)
        if handle is not None:
            handle.remove()

    # -- the backward's start and the step's start (called by the clock while armed) -----------

    def backward_started(self, tensors: object, forwarded: bool) -> None:
        self.backward_armed = False
        if not self.guard.on:
            return
        try:
            self._read_backward(tensors, forwarded)
        except Exception as exc:
            self.guard.failed(exc)

    def _read_backward(self, tensors: object, forwarded: bool) -> None:
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())  # type: ignore[call-overload]
        opt_ids = self._optimizer_ids()
        graph = walk(roots, self._param_ids, opt_ids)
        kept: bool | None = None
        left = self._left
        if left is not None and forwarded:
            param, grad = left[0](), left[1]()
            if param is not None:
                now = param.grad
                kept = now is not None and now is grad and now._version == left[2]  # noqa: SLF001
        watch = graph.pop("_watch", None)
        if isinstance(watch, torch.Tensor):
            self._watched = weakref.ref(watch)
            if forwarded:
                self._pre_param = weakref.ref(watch)
                self.pre_step_armed = True
                # The gradient's in-place version once the backward has accumulated into it:
                # at step() a higher one means it was written in place since (zeroed, or
                # clipped / unscaled, which the clock counts).
                self._accumulated = -1
                self._drop_hook("accumulated")
                hook = watch.register_post_accumulate_grad_hook  # untyped in torch's stubs
                self._handles["accumulated"] = hook(self._grad_accumulated)  # type: ignore[no-untyped-call]
        facts = (
            *((k, v) for k, v in graph.items() if not isinstance(v, torch.Tensor)),
            ("forwarded", forwarded),
            ("grads_kept", kept),
            ("scaled", self.scaled),
        )
        self._put(StructureRecord(self._step(), "backward", facts))  # type: ignore[arg-type]

    def _grad_accumulated(self, param: torch.Tensor) -> None:
        grad = param.grad
        if grad is not None:
            self._accumulated = grad._version  # noqa: SLF001

    def pre_step_started(self, clips: int = 0) -> None:
        self.pre_step_armed = False
        self._drop_hook("accumulated")
        if not self.guard.on or self._pre_param is None:
            return
        try:
            param = self._pre_param()
            self._pre_param = None
            if param is not None:
                grad = param.grad
                rewritten: bool | None = None
                if grad is not None and self._accumulated >= 0:
                    writes = grad._version - self._accumulated  # noqa: SLF001
                    # clip_grad_norm_ scales in place once a call, a GradScaler unscales once.
                    rewritten = writes > clips + (1 if self.scaled else 0)
                facts: tuple[tuple[str, Fact], ...] = (
                    ("grad_present", grad is not None),
                    ("rewritten", rewritten),
                )
                self._put(StructureRecord(self._step(), "pre_step", facts))
        except Exception as exc:
            self.guard.failed(exc)


def _through_views(node: Any) -> str:
    """The name of the first node under ``node`` that is not a view (bounded)."""
    for _ in range(16):
        if node is None:
            return ""
        name = type(node).__name__
        if name not in _VIEWS:
            return name
        nexts = node.next_functions
        node = nexts[0][0] if nexts else None
    return ""


def walk(
    roots: list[Any], param_ids: frozenset[int], opt_ids: frozenset[int], limit: int = NODE_LIMIT
) -> dict[str, object]:
    """What the graph behind ``roots`` says, breadth first over at most ``limit`` nodes:
    ``leaf_root`` (a root with no graph: a loss made a leaf), ``reached`` (parameters of the
    model reached), ``complete`` (the whole graph was walked), ``root`` (the root's node),
    ``probabilities_into`` (a softmax or sigmoid feeding a loss that wants logits: the
    loss's name), ``loss_node`` and ``reduction``; ``_watch`` is a reached parameter the
    optimizer holds."""
    out: dict[str, object] = {
        "leaf_root": False,
        "reached": 0,
        "complete": True,
        "root": None,
        "probabilities_into": None,
        "loss_node": None,
        "reduction": None,
    }
    queue: deque[Any] = deque()
    for root in roots:
        if not isinstance(root, torch.Tensor) or not root.requires_grad:
            continue
        fn = root.grad_fn
        if fn is None:
            if id(root) in param_ids:
                out["reached"] = int(out["reached"]) + 1  # type: ignore[call-overload]
            else:
                out["leaf_root"] = True
            continue
        if out["root"] is None:
            out["root"] = type(fn).__name__
        queue.append(fn)
    seen: set[int] = set()
    watch = None
    visited = 0
    reached = int(out["reached"])  # type: ignore[call-overload]
    while queue:
        if visited >= limit:
            out["complete"] = False
            break
        node = queue.popleft()
        if id(node) in seen:
            continue
        seen.add(id(node))
        visited += 1
        name = type(node).__name__
        if name == "AccumulateGrad":
            var = node.variable
            if id(var) in param_ids:
                reached += 1
                if watch is None and id(var) in opt_ids:
                    watch = var
            continue
        if name in _LOSS_NODES and out["loss_node"] is None:
            out["loss_node"] = name
            reduction = getattr(node, "_saved_reduction", None)
            if isinstance(reduction, int):
                out["reduction"] = _REDUCTIONS.get(reduction)
        wants = _WANTS_LOGITS.get(name)
        if (
            wants is not None
            and out["probabilities_into"] is None
            and node.next_functions
            and _through_views(node.next_functions[0][0]) == wants[0]
        ):
            out["probabilities_into"] = wants[1]
        for child, _ in node.next_functions:
            if child is not None:
                queue.append(child)
    out["reached"] = reached
    out["nodes"] = visited
    if watch is not None:
        out["_watch"] = watch
    return out


__all__ = ["ADAPTIVE", "NODE_LIMIT", "StructureProbe", "optimizer_facts", "walk"]
