"""A graph traced with symbolic sizes, made static for one call's sizes.

A backend that compiles static shapes only still serves a symbolic graph: for each distinct
set of input sizes it compiles the graph specialized to them. The specialized graph is the
graph a static capture of those inputs would have given: every size node (``sym_size`` and
the arithmetic over it) is replaced by its number, and every ``meta["val"]`` is a fake with
those sizes, so the backend sees no symbol.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.capture.meta import FakeMode
from kiln.capture.shapes.dispatch import has_symbolic_sizes

__all__ = ["has_symbolic_inputs", "number_inputs", "specialize_graph"]


def _is_symbolic(v: Any) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def has_symbolic_inputs(gm: fx.GraphModule) -> bool:
    """Whether any placeholder of ``gm`` has symbolic sizes or is a symbolic number."""
    return any(
        (isinstance(v := n.meta.get("val"), torch.Tensor) and has_symbolic_sizes(v))
        or _is_symbolic(v)
        for n in gm.graph.nodes
        if n.op == "placeholder"
    )


def number_inputs(gm: fx.GraphModule) -> list[int]:
    """The positions of ``gm``'s placeholders that are symbolic Python numbers."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, n in enumerate(placeholders) if _is_symbolic(n.meta.get("val"))]


class _Propagate(fx.Interpreter):
    """Runs the graph on fakes of the real inputs, recording each node's static value."""

    def __init__(self, gm: fx.GraphModule, mode: FakeMode) -> None:
        super().__init__(gm)
        self.mode = mode

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if n.op != "output":
            n.meta["val"] = result
        return result


def specialize_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """A copy of ``gm`` static for ``example_inputs``' sizes (real tensors, as backends get)."""
    graph = copy.deepcopy(gm.graph)
    out = fx.GraphModule(gm, graph)
    mode = FakeMode()
    grad_mode = torch.is_grad_enabled()  # the graph's own grad-mode nodes run too
    try:
        with mode:
            fakes = [mode.to_fake(a) if isinstance(a, torch.Tensor) else a for a in example_inputs]
            _Propagate(out, mode).run(*fakes)
    finally:
        torch._C._set_grad_enabled(grad_mode)
    for n in list(graph.nodes):
        value = n.meta.get("val")
        if n.op == "call_function" and _is_size_node(n) and isinstance(value, (int, float, bool)):
            n.replace_all_uses_with(value)  # type: ignore[arg-type]
            graph.erase_node(n)
    for n in graph.nodes:
        if any(_is_symbolic(v) for v in pytree.tree_leaves(n.meta.get("val"))):
            msg = f"{n.name} is still symbolic after specializing"
            raise AssertionError(msg)
    graph.lint()
    out.recompile()
    return out


_SIZE_TARGETS = frozenset(
    {
        torch.ops.aten.sym_size.int,
        torch.ops.aten.sym_stride.int,
        torch.sym_max,
        torch.sym_min,
    }
)


def _is_size_node(n: fx.Node) -> bool:
    """A node computing a number from sizes (the only non-tensor nodes a symbolic graph adds)."""
    if n.target in _SIZE_TARGETS:
        return True
    module = getattr(n.target, "__module__", None)
    return module in ("_operator", "operator") and not any(
        isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) for a in n.args
    )
