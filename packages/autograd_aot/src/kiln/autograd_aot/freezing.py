"""Freezing: a forward-only program's module state taken as constants, and what the program
computes from that state alone computed once, ahead of the calls.

Why here: autograd_aot knows which graph inputs are module state (the parameters and buffers
it lifted itself, or, for a captured graph, the placeholders whose source is an entry of a
module's ``_parameters``/``_buffers`` or that hold an ``nn.Parameter``), which program has no
backward, and which inputs a program writes. The ATen graph it hands to ``fw_compiler`` is
where the arithmetic on weights is explicit (batch norm's decomposition, casts, transposes).
So the pass runs between tracing and the compiler, which receives an ordinary ATen graph whose
inputs are the call's other inputs followed by the folded constants: no compiler needs to know
of freezing.

The plan (:func:`plan_freezing`): a node is *folded* when it is a deterministic ATen op whose
inputs are all folded or state (a node that a graph output is, or views, is never folded, so
no call returns a cached tensor), and its result is no larger than its largest input (so a
small weight is never expanded into a large constant). First, per-channel affine arithmetic
on a convolution's output whose operands are folded, eval-mode batch norm's, moves into the
convolution's weight and bias (:mod:`~kiln.autograd_aot.conv_folding`). The folded nodes that
the rest of the graph reads are the *constants*: a graph of their own computes them from the
state tensors (:attr:`FreezePlan.constants`), and the runtime graph takes them as inputs.

Soundness (:class:`FrozenForward`): each call compares its state tensors with those the
constants were computed from: the same objects, at the same ``_version`` (every in-place
write: ``load_state_dict``'s ``copy_``, an optimizer step, ``p.mul_(2)``) and the same data
pointer (``p.data = t``). Any difference computes the constants again from this call's
tensors, eagerly, before the compiled graph runs: a changed weight is never read stale.
Programs that write an input (train-mode batch norm's statistics) or have a backward are
never frozen.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from kiln.autograd_aot.conv_folding import fold_conv_affine
from kiln.autograd_aot.onednn_packing import PACKING_OPS, prepack_convolutions, prepack_linears
from kiln.autograd_aot.symbolic import is_symbolic
from kiln.capture import artifacts, counters
from kiln.capture.source import AttrSource, ItemSource

__all__ = ["FreezePlan", "FrozenForward", "compile_frozen", "plan_freezing", "state_positions"]

log = logging.getLogger("kiln.autograd_aot.aot")

# a factory with no input (``full``, ``scalar_tensor``) is folded only up to this many elements
_FACTORY_NUMEL = 64


def compile_frozen(
    gm: fx.GraphModule,
    state: Sequence[int],
    fw_compiler: Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]],
) -> FrozenForward | None:
    """``gm`` (a forward-only program writing no input) compiled frozen, with its inputs at
    ``state`` as module state; None where it runs off the CPU or nothing would be folded."""
    inputs = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in inputs):
        return None
    plan = plan_freezing(gm, state)
    if plan is None:
        return None
    counters.bump("autograd_aot", "frozen_programs")
    log.info(
        "frozen: %d ops folded, %d convolutions, %d prepacked, %d linears prepacked",
        plan.folded_ops,
        plan.folded_convolutions,
        plan.packed_convolutions,
        plan.packed_linears,
    )
    artifacts.dump("aot_frozen.py", plan.runtime.code)
    fakes = [n.meta["val"] for n in plan.runtime.graph.find_nodes(op="placeholder")]
    compiled = fw_compiler(plan.runtime, fakes)
    return FrozenForward(compiled, plan.constants, plan.frozen, plan.kept)


def state_positions(
    gm: torch.nn.Module, example_inputs: Sequence[Any], num_state: int, unless_grad: bool = False
) -> list[int]:
    """The primals that are module state: the ``num_state`` lifted ones, or, for a captured
    graph taking its state as inputs, the tensor inputs read from a module's ``_parameters``
    or ``_buffers`` (their placeholder's source) or holding an ``nn.Parameter``. With
    ``unless_grad``, none where any of them requires grad: the default freezes only a model
    set up for inference alone, whose weights a training loop is not writing between calls."""
    if num_state:
        if unless_grad and any(p.requires_grad for p in gm.parameters()):
            return []
        return list(range(num_state))
    if not isinstance(gm, fx.GraphModule):
        return []
    sources = [n.meta.get("source") for n in gm.graph.find_nodes(op="placeholder")]
    if len(sources) != len(example_inputs):
        return []
    found: list[int] = []
    primal = 0
    for source, value in zip(sources, example_inputs, strict=True):
        if not isinstance(value, torch.Tensor):
            continue
        # an inference tensor tracks no version, so a write to it could not be seen
        state = isinstance(value, torch.nn.Parameter) or _is_state_source(source)
        if state and not value.is_inference():
            if unless_grad and value.requires_grad:
                return []
            found.append(primal)
        primal += 1
    return found


def _is_state_source(source: object) -> bool:
    return (
        isinstance(source, ItemSource)
        and isinstance(source.base, AttrSource)
        and source.base.name in ("_parameters", "_buffers")
    )


@dataclasses.dataclass
class FreezePlan:
    """How a graph runs frozen: ``constants(*graph inputs at frozen)`` gives the constants,
    ``runtime(*graph inputs at kept, *constants)`` the graph's outputs."""

    runtime: fx.GraphModule
    constants: fx.GraphModule
    frozen: tuple[int, ...]
    kept: tuple[int, ...]
    folded_ops: int  # ATen ops computed ahead of the calls (views not counted)
    folded_convolutions: int  # convolutions whose following affine arithmetic was folded
    packed_convolutions: int = 0  # convolutions calling oneDNN on a prepacked weight
    packed_linears: int = 0  # matrix products by a weight calling oneDNN on a prepacked one


def _is_view(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and bool(target.is_view)


def _foldable_op(node: fx.Node) -> bool:
    target = node.target
    if target is operator.getitem or target in PACKING_OPS:
        return True
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags and not target._schema.is_mutable


def _numel(val: Any) -> int | None:
    """Elements of a static tensor value (the largest of a tuple's); None for anything else."""
    if isinstance(val, torch.Tensor):
        return None if is_symbolic(val) else val.numel()
    if isinstance(val, (tuple, list)) and val:
        sizes = [_numel(v) for v in val if v is not None]
        if not sizes or any(s is None for s in sizes):
            return None
        return max(s for s in sizes if s is not None)
    return None


def prune_dead(graph: fx.Graph) -> None:
    """Remove the ops nothing reads, except random ones (they draw from the generator)."""
    for node in reversed(graph.nodes):
        if node.op == "call_function" and not node.users and _foldable_op(node):
            graph.erase_node(node)


def _pinned(graph: fx.Graph) -> set[fx.Node]:
    """The nodes a graph output is or views: computed in every call, never cached."""
    pinned: set[fx.Node] = set()
    output = next(iter(graph.find_nodes(op="output")))
    for returned in output.all_input_nodes:
        node = returned
        while node not in pinned and node.op == "call_function":
            pinned.add(node)
            if not _is_view(node) or not node.args or not isinstance(node.args[0], fx.Node):
                break
            node = node.args[0]
    return pinned


def _folded(graph: fx.Graph, frozen: set[fx.Node]) -> dict[fx.Node, bool]:
    """The nodes computable ahead of the calls, each with whether it reads state (False: a
    small factory, computed where it is needed)."""
    pinned = _pinned(graph)
    fold: dict[fx.Node, bool] = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            if node in frozen:
                fold[node] = True
            continue
        if node.op != "call_function" or node in pinned or not _foldable_op(node):
            continue
        inputs = node.all_input_nodes
        if not all(i in fold for i in inputs):
            continue
        numel = _numel(node.meta.get("val"))
        if numel is None:
            continue
        largest = max((_numel(i.meta.get("val")) or 0 for i in inputs), default=_FACTORY_NUMEL)
        if numel > largest:
            continue
        fold[node] = any(fold[i] for i in inputs)
    return fold


def plan_freezing(gm: fx.GraphModule, frozen: Sequence[int]) -> FreezePlan | None:
    """The frozen form of ``gm`` (not changed) with the graph inputs at ``frozen`` as state;
    None when nothing but views would be computed ahead of the calls."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    placeholders = list(graph.find_nodes(op="placeholder"))
    frozen_nodes = {placeholders[i] for i in frozen}
    fold = _folded(graph, frozen_nodes)
    convolutions = fold_conv_affine(graph, lambda n: fold.get(n) is True)
    if convolutions:
        prune_dead(graph)
        fold = _folded(graph, frozen_nodes)
    packed = prepack_convolutions(graph, lambda n: fold.get(n) is True, _pinned(graph))
    linears = prepack_linears(graph, lambda n: fold.get(n) is True)
    if packed or linears:
        prune_dead(graph)
        fold = _folded(graph, frozen_nodes)
    constants = [n for n, state in fold.items() if state and any(u not in fold for u in n.users)]
    if any(not isinstance(n.meta.get("val"), torch.Tensor) for n in constants):
        return None
    ops = sum(
        1
        for n, state in fold.items()
        if state
        and n.op == "call_function"
        and n.target is not operator.getitem
        and not _is_view(n)
    )
    if not ops:
        return None
    kept = tuple(i for i, p in enumerate(placeholders) if p not in frozen_nodes)
    return FreezePlan(
        runtime=_runtime_graph(gm, graph, [placeholders[i] for i in kept], constants, fold),
        constants=_constants_graph(gm, graph, [placeholders[i] for i in frozen], constants, fold),
        frozen=tuple(frozen),
        kept=kept,
        folded_ops=ops,
        folded_convolutions=convolutions,
        packed_convolutions=packed,
        packed_linears=linears,
    )


def _runtime_graph(
    root: fx.GraphModule,
    graph: fx.Graph,
    kept: list[fx.Node],
    constants: list[fx.Node],
    fold: dict[fx.Node, bool],
) -> fx.GraphModule:
    """The per-call graph, on the traced module as root: its ``get_attr`` nodes name tensors
    an op made while tracing (``torch.tensor([...])`` in ``forward``), which are that
    module's attributes."""
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in kept:
        env[node] = new.node_copy(node, env.__getitem__)
    for node in constants:
        env[node] = new.placeholder(f"frozen_{node.name}")
        env[node].meta["val"] = node.meta["val"]
    for node in graph.nodes:
        if node.op == "placeholder" or node in env or fold.get(node):
            continue
        env[node] = new.node_copy(node, env.__getitem__)
    prune_dead(new)
    return fx.GraphModule(root, new)


def _constants_graph(
    root: fx.GraphModule,
    graph: fx.Graph,
    frozen: list[fx.Node],
    constants: list[fx.Node],
    fold: dict[fx.Node, bool],
) -> fx.GraphModule:
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in frozen:
        env[node] = new.node_copy(node, env.__getitem__)
    for node in graph.nodes:
        if node in fold and node.op == "call_function":
            env[node] = new.node_copy(node, env.__getitem__)
    new.output(tuple(env[n] for n in constants))
    prune_dead(new)
    return fx.GraphModule(root, new)


@dataclasses.dataclass(frozen=True)
class _State:
    """The constants, and the state tensors (with their versions and data) they came from."""

    tensors: tuple[torch.Tensor, ...]
    versions: tuple[int, ...] | None
    pointers: tuple[int, ...]
    constants: tuple[torch.Tensor, ...]


class FrozenForward:
    """The compiled runtime graph, called like the program's forward: it feeds the constants,
    computing them again whenever a state tensor is another object, at another version or on
    other data than those they were computed from."""

    def __init__(
        self,
        compiled: Callable[..., Any],
        constants: fx.GraphModule,
        frozen: tuple[int, ...],
        kept: tuple[int, ...],
        layouts: list[tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
    ) -> None:
        self.compiled = compiled
        self.constants = constants
        self.frozen = frozen
        self.kept = kept
        if layouts is None:  # the constants' traced sizes and strides
            outputs = next(iter(constants.graph.find_nodes(op="output"))).args[0]
            layouts = [(tuple(n.meta["val"].shape), n.meta["val"].stride()) for n in outputs]
        self._layouts = layouts
        self._state: _State | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # stored without the constants (the user's weights): computed again on the first call;
        # a pickled graph loses its nodes' values, so the layouts go along
        args = (self.compiled, self.constants, self.frozen, self.kept, self._layouts)
        return FrozenForward, args

    def __call__(self, *inputs: Any) -> Any:
        frozen = [inputs[i] for i in self.frozen]
        state = self._state
        if state is None or not _unchanged(state, frozen):
            state = self._refresh(frozen)
        return self.compiled(*[inputs[i] for i in self.kept], *state.constants)

    def _refresh(self, frozen: list[torch.Tensor]) -> _State:
        with torch.no_grad():
            values = list(self.constants(*frozen))
        for i, (value, (size, stride)) in enumerate(zip(values, self._layouts, strict=True)):
            # the compiled graph assumes the traced layout (a packed weight has none: opaque)
            if not value.is_mkldnn and value.stride() != stride:
                values[i] = torch.empty_strided(
                    size, stride, dtype=value.dtype, device=value.device
                ).copy_(value)
        try:
            versions: tuple[int, ...] | None = tuple(t._version for t in frozen)
        except RuntimeError:  # an inference tensor tracks no version: computed every call
            versions = None
        state = _State(
            tuple(frozen),
            versions,
            tuple(t.data_ptr() for t in frozen),
            tuple(values),
        )
        self._state = state
        return state


def _unchanged(state: _State, frozen: list[torch.Tensor]) -> bool:
    if state.versions is None:
        return False
    for t, was, version, pointer in zip(
        frozen, state.tensors, state.versions, state.pointers, strict=True
    ):
        if t is not was or t._version != version or t.data_ptr() != pointer:
            return False
    return True
