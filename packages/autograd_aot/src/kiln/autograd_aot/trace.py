"""Kiln's ATen tracer: a dispatch mode over fake tensors that records an FX graph.

Every ATen op that reaches the mode is (1) made functional when it mutates
(``mutation.py`` holds the rules), (2) decomposed when the table has an
entry (the decomposition's own ops come back through the mode, so the table is
applied to a fixed point), or (3) run on fake tensors and recorded as a node
whose ``meta["val"]`` is the fake result. Autograd runs above the mode, so a
backward pass run on the traced fakes is recorded too (the joint graph).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.autograd_aot.decomp import DecompositionTable
from kiln.autograd_aot.errors import AotError, UnsupportedMutation
from kiln.autograd_aot.mutation import (
    ViewStep,
    apply_view,
    functional_variant,
    is_mutation,
    is_view,
    mutated_args,
    scatter_into,
    unhide_mutation,
)
from kiln.autograd_aot.regions import REGION, current_region, random_in_region
from kiln.autograd_aot.subclasses import is_wrapper_type
from kiln.autograd_aot.symbolic import SymbolReader, is_symbolic_value
from kiln.capture.eager_refusals import check_as_eager
from kiln.capture.meta import (
    RESTRIDES,
    FakeMode,
    fake_like,
    is_fake,
    is_noop_restride,
    meta_of,
    restride_in_place,
    run_fake,
    to_fake,
)

__all__ = ["AtenTracer", "trace_aten", "verify_aten_graph"]

aten = torch.ops.aten

_NUMBER_DTYPES = {
    bool: torch.bool,
    int: torch.int64,
    float: torch.float64,
    complex: torch.complex128,
}


@dataclasses.dataclass
class _Root:
    """A value that views hang off: a graph input, a constant or a computed tensor."""

    fake: torch.Tensor
    kind: str  # "input", "constant" or "value"
    input_index: int | None = None
    version: int = 0
    # a write ran with grad enabled: eager's autograd recorded it on the input's history
    written_with_grad: bool = False


@dataclasses.dataclass
class _Tracked:
    """What the tracer knows of one tensor: its node, root and view chain."""

    fake: torch.Tensor
    node: fx.Node
    root: int
    chain: tuple[ViewStep, ...]
    version: int


def _has_implicit_kernel(func: Any) -> bool:
    return bool(
        torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    )


class AtenTracer(TorchDispatchMode):
    """Records ATen ops on fake tensors into ``self.graph``, made functional and decomposed."""

    def __init__(self, decompositions: DecompositionTable) -> None:
        super().__init__()
        self.graph = fx.Graph()
        self.module = torch.nn.Module()
        self.decompositions = decompositions
        self._tracked: dict[int, _Tracked] = {}
        self._roots: list[_Root] = []
        self._constants = FakeMode()
        self._last_placeholder: fx.Node | None = None
        self._inputs: list[tuple[fx.Node, Any]] = []
        # symbolic sizes an op takes become nodes reading them from the inputs
        self._symbols = SymbolReader(self.graph, lambda: self._inputs)

    # inputs and outputs -------------------------------------------------------------

    def placeholder(self, fake: torch.Tensor, name: str) -> fx.Node:
        """Make ``fake`` a graph input (placed after the inputs made so far)."""
        where = self._last_placeholder
        ctx = self.graph.inserting_after(where) if where else self.graph.inserting_before(None)
        with ctx:
            node = self.graph.placeholder(name)
        node.meta["val"] = fake
        self._last_placeholder = node
        self._inputs.append((node, fake))
        if isinstance(fake, torch.Tensor):  # not a symbolic number
            index = sum(1 for r in self._roots if r.kind == "input")
            self._new_root(fake, node, "input", index)
        return node

    def input_root(self, t: torch.Tensor) -> int | None:
        """The input index whose storage ``t`` views, or None."""
        info = self._tracked.get(id(t))
        if info is None:
            return None
        return self._roots[info.root].input_index

    def view_of(self, t: torch.Tensor) -> tuple[int, tuple[ViewStep, ...]] | None:
        """The root id of ``t`` and the view ops leading from the root to it."""
        info = self._tracked.get(id(t))
        return None if info is None else (info.root, info.chain)

    def mutated_inputs(self) -> list[tuple[int, torch.Tensor]]:
        """(input index, current value) for every input written so far."""
        return [
            (r.input_index, r.fake)
            for r in self._roots
            if r.kind == "input" and r.version > 0 and r.input_index is not None
        ]

    def inputs_written_with_grad(self) -> set[int]:
        """The inputs some write reached with grad enabled (the others' writes are not part of
        their autograd history, as under ``no_grad`` in eager)."""
        return {
            r.input_index
            for r in self._roots
            if r.kind == "input" and r.written_with_grad and r.input_index is not None
        }

    def finish(self, outputs: Sequence[Any]) -> fx.GraphModule:
        """Close the graph with ``outputs`` (tensors, None, symbolic numbers) and drop dead
        nodes."""
        out = tuple(None if o is None else self._node_or_number(o) for o in outputs)
        self.graph.output(out)
        self.graph.eliminate_dead_code()
        gm = fx.GraphModule(self.module, self.graph)
        verify_aten_graph(gm)
        return gm

    # tensor bookkeeping -------------------------------------------------------------

    def _new_root(
        self, fake: torch.Tensor, node: fx.Node, kind: str, index: int | None = None
    ) -> None:
        self._roots.append(_Root(fake, kind, index))
        self._tracked[id(fake)] = _Tracked(fake, node, len(self._roots) - 1, (), 0)

    def _constant(self, real: torch.Tensor) -> torch.Tensor:
        fake = self._constants.to_fake(real)
        if id(fake) not in self._tracked:
            name = f"_tensor_constant{len(self._roots)}"
            setattr(self.module, name, real)
            node = self.graph.get_attr(name)
            node.meta["val"] = fake
            self._new_root(fake, node, "constant")
        return fake

    def _as_fake(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor) and not is_fake(a):
            return self._constant(a)
        return a

    def _node_or_number(self, o: Any) -> Any:
        return self._symbols.node_for(o) if is_symbolic_value(o) else self.node_of(o)

    def node_of(self, t: torch.Tensor) -> fx.Node:
        """The node holding ``t``'s current value (regenerated if an alias was mutated)."""
        t = self._as_fake(t)
        info = self._tracked.get(id(t))
        if info is None:
            msg = (
                "the traced function used a fake tensor made outside this trace; pass it "
                "in as an input"
            )
            raise AotError(msg)
        root = self._roots[info.root]
        if info.version != root.version:
            value = root.fake
            with self:
                for step in info.chain:
                    value = apply_view(step, value)
            info.node = self._tracked[id(value)].node
            info.version = root.version
        return info.node

    def _as_node(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return self.node_of(a)
        return self._symbols.node_for(a) if is_symbolic_value(a) else a

    # dispatch ---------------------------------------------------------------------

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if any(is_wrapper_type(t) for t in types):
            return NotImplemented  # its __torch_dispatch__ runs; its ops on inner tensors reach us
        kwargs = kwargs or {}
        func = unhide_mutation(func, args)
        if is_noop_restride(func, args, kwargs):
            return args[0]
        if func.overloadpacket in RESTRIDES:
            return self._restride(func, args, kwargs)
        if func is aten._to_copy.default and isinstance(args[0], (bool, int, float, complex)):
            # torch hands a mode a wrapped number (a batching rule promoting ``i * 2``'s 2) as
            # the number itself; the graph makes the tensor, which backends can lower
            options = {k: v for k, v in kwargs.items() if k in ("dtype", "device")}
            if options.get("dtype") is None:  # a wrapped number's own dtype
                options["dtype"] = _NUMBER_DTYPES[type(args[0])]
            with self:
                return aten.scalar_tensor.default(args[0], **options)
        if is_mutation(func):
            return self._mutation(func, args, kwargs)
        decomp = self.decompositions.get(func)
        if decomp is None and current_region.get() is not None:
            decomp = random_in_region().get(func)
        if decomp is not None:
            with self:
                out = decomp(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if _has_implicit_kernel(func):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return self._record(func, args, kwargs)

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        fake_args, fake_kwargs = pytree.tree_map(self._as_fake, (args, kwargs))
        node_args, node_kwargs = pytree.tree_map(self._as_node, (fake_args, fake_kwargs))
        out = run_fake(func, fake_args, fake_kwargs, lambda r: meta_of(self._constant(r)))
        node = self.graph.call_function(func, tuple(node_args), node_kwargs)
        node.meta["val"] = out
        region = current_region.get()
        if region is not None:
            node.meta[REGION] = region
        base = fake_args[0] if is_view(func) else None
        if isinstance(out, (list, tuple)):
            for i, item in enumerate(out):
                if isinstance(item, torch.Tensor):
                    item_node = self.graph.call_function(operator.getitem, (node, i))
                    item_node.meta["val"] = item
                    if region is not None:
                        item_node.meta[REGION] = region
                    step = ViewStep(func, tuple(fake_args[1:]), tuple(fake_kwargs.items()), i)
                    self._track(item, item_node, base, step)
        elif isinstance(out, torch.Tensor):
            step = ViewStep(func, tuple(fake_args[1:]), tuple(fake_kwargs.items()))
            self._track(out, node, base, step)
        return out

    def record_call(
        self, target: Callable[..., Any], args: Sequence[Any], results: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        """Record ``target(*args)`` as one node the tracer does not look into (a higher-order
        op holding its own graphs), returning ``results``: new fakes the caller made, each
        tracked as a new value."""
        node = self.graph.call_function(target, tuple(self._as_node(a) for a in args))
        node.meta["val"] = tuple(results)
        region = current_region.get()
        for i, result in enumerate(results):
            item = self.graph.call_function(operator.getitem, (node, i))
            item.meta["val"] = result
            for marked in (node, item) if region is not None else ():
                marked.meta[REGION] = region
            self._new_root(result, item, "value")
        return tuple(results)

    def _track(
        self, out: torch.Tensor, node: fx.Node, base: torch.Tensor | None, step: ViewStep
    ) -> None:
        if id(out) in self._tracked:
            return
        if base is None:
            self._new_root(out, node, "value")
            return
        parent = self._tracked[id(base)]
        chain = (*parent.chain, step)
        self._tracked[id(out)] = _Tracked(out, node, parent.root, chain, parent.version)

    def _restride(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``t.squeeze_(0)`` and the like on a tensor the trace computed: from here on ``t``
        is the view the out-of-place op makes. ATen's composite ops do this to their own
        intermediates (``matmul`` of a vector squeezes its ``mm`` in place), which torch.func's
        batching rules pass down as they are. On an input or a constant the change would be
        seen outside the graph, which the functional graph cannot express: refused."""
        target = self._as_fake(args[0])
        self.node_of(target)
        info = self._tracked[id(target)]
        root = self._roots[info.root]
        if root.kind != "value":
            mutated_args(func, args, kwargs)  # raises the refusal
        with self:
            view = functional_variant(func).op(target, *args[1:], **kwargs)
        # the nodes that computed ``t`` and its root keep their metadata (the graph's
        # values do not change; views are rebuilt from the root): a fake of the old one
        alias = meta_of(target).as_strided(target.shape, target.stride(), target.storage_offset())
        before = fake_like(alias, target.device)
        if info.node.meta.get("val") is target:
            info.node.meta["val"] = before
        if root.fake is target:
            root.fake = before
            self._tracked[id(before)] = dataclasses.replace(info, fake=before)
        restride_in_place(func, target, *args[1:], **kwargs)
        self._tracked[id(target)] = dataclasses.replace(self._tracked[id(view)], fake=target)
        return target

    def _mutation(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # inputs traced over their bases share memory here where capture's fakes did not
        check_as_eager(func, args, kwargs)
        targets = mutated_args(func, args, kwargs)
        functional = functional_variant(func)
        fkwargs = {k: v for k, v in kwargs.items() if k not in functional.drop}
        args = _with_positional_defaults(func, args)
        with self:
            result = functional.op(*args, **fkwargs)
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        if functional.appends_values:
            n = len(func._schema.returns)
            results, values = results[:n], results[n:]
            for target, value in zip(targets, values, strict=True):
                self._write(target, value)
            return results[0] if n == 1 else tuple(results)
        for target, value in zip(targets, results, strict=False):
            self._write(target, value)
        if not functional.drop:
            return args[0]
        return targets[0] if len(targets) == 1 else tuple(targets)

    def _write(self, target: torch.Tensor, value: torch.Tensor) -> None:
        """Make ``value`` the new contents of ``target`` and, through it, of its root."""
        target = self._as_fake(target)
        self.node_of(target)
        info = self._tracked[id(target)]
        root = self._roots[info.root]
        if root.kind == "constant":
            msg = "the traced function mutates a tensor constant; make it an input instead"
            raise UnsupportedMutation(msg)
        if value.shape != target.shape and (
            torch.broadcast_shapes(value.shape, target.shape) != target.shape
        ):
            msg = (
                f"an out= op resizes its output from {tuple(target.shape)} to "
                f"{tuple(value.shape)}; allocate the output with the result's shape"
            )
            raise UnsupportedMutation(msg)
        with self:
            if value.dtype != target.dtype:
                value = aten._to_copy.default(value, dtype=target.dtype)
            if value.shape != target.shape:
                value = aten.expand.default(value, list(target.shape))
            parents = [root.fake]
            for step in info.chain[:-1]:
                parents.append(apply_view(step, parents[-1]))
            new = value
            for step, parent in zip(
                reversed(info.chain), reversed(parents[: len(info.chain)]), strict=True
            ):
                new = scatter_into(step, parent, new)
            if self._tracked[id(new)].root == info.root:
                new = aten.clone.default(new)
        root.fake = new
        root.version += 1
        root.written_with_grad |= torch.is_grad_enabled()
        info.node = self.node_of(value)
        info.version = root.version


def verify_aten_graph(gm: fx.GraphModule) -> None:
    """Check the contract of graphs handed to compilers: functional, with fake values."""
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        target = node.target
        if node.op == "call_function" and hasattr(target, "_schema") and is_mutation(target):
            msg = f"a mutating op survived the functionalization pass: {node.format_node()}"
            raise AotError(msg)
        if "val" not in node.meta:
            msg = f"node without a fake value: {node.format_node()}"
            raise AotError(msg)


def _with_positional_defaults(func: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with the defaults the dispatcher left out filled in, since a functional
    variant may not share them (``bernoulli_.float`` defaults ``p``, ``bernoulli.p`` does not)."""
    positional = [a for a in func._schema.arguments if not a.kwarg_only]
    extra = [a.default_value for a in positional[len(args) :] if a.has_default_value()]
    return (*args, *extra)


def trace_aten(
    fn: Callable[..., Any],
    fake_args: Sequence[torch.Tensor],
    decompositions: DecompositionTable,
) -> fx.GraphModule:
    """Trace ``fn`` on fake tensors into a functional ATen graph.

    The graph takes the fakes' values as inputs and returns ``fn``'s tensor
    outputs (flattened), then the new values of inputs ``fn`` mutated.
    """
    tracer = AtenTracer(decompositions)
    mode = FakeMode()
    fakes = [to_fake(a, mode) for a in fake_args]
    for i, f in enumerate(fakes):
        tracer.placeholder(f, f"arg{i}")
    with tracer:
        out = fn(*fakes)
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    leaves += [value for _, value in tracer.mutated_inputs()]
    return tracer.finish(leaves)
