"""Values computed from tensor data: unbacked symbols bound by the extern call that makes them.

A graph captured with ``capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops`` holds
sizes and numbers no input carries: ``nonzero``'s row count, ``x[mask]``'s length, ``unique``'s
count, ``t.item()``. The op that computes one stays an ATen call from the wrapper (an extern
step); the wrapper binds the symbol from its result right after it (``u0 = buf3.shape[0]``,
``u1 = buf5`` for an ``item()``), and from there the symbol is a size like any other: later
allocations, views, loop bounds and kernel size arguments read it.

Three things make that hold:

* **Definitions** (:class:`UnbackedDefs`): which buffer each symbol is read from, noted as the
  graph is lowered (:func:`bind_new_outputs`, :func:`read_scalar`).
* **Order**: a node whose sizes or indices use a symbol runs after the step that defines it,
  though it reads none of that step's data (``torch.full((n,), 3.0)`` after ``n = t.item()``):
  :func:`symbols_used` gives the scheduler that edge.
* **Runtime asserts**: the facts capture assumed of the data (``aten._assert_scalar``: a count
  that must be even to ``view(-1, 2)``, a ``torch._check``) are checked by the wrapper as soon
  as their symbols are bound, raising ``RuntimeError`` as eager would (:func:`assert_source`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln.loopir import symbolic
from kiln.loopir.analysis import ReadWriteHandler
from kiln.loopir.errors import StaticShapesOnly
from kiln.loopir.ir.buffers import Buffer, ComputedBuffer, ExternBuffer, MultiOutput
from kiln.loopir.ir.layout import Layout
from kiln.loopir.ir.loops import Reduction
from kiln.loopir.ir.strided import realize_as_tensor
from kiln.loopir.ir.views import ReinterpretView, TensorBox
from kiln.loopir.kernel import RINDEX, XINDEX, KernelNode
from kiln.loopir.virtualized import V, set_ops_handler

__all__ = [
    "Condition",
    "RuntimeAssert",
    "UnbackedDefs",
    "assert_source",
    "bind_new_outputs",
    "condition",
    "read_scalar",
    "refuse_conditions",
    "runtime_assert",
    "symbols_used",
]

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Condition:
    """A symbolic bool of the graph (``u0 >= 0``): only a runtime assert may take it."""

    expr: sympy.Basic


@dataclasses.dataclass(frozen=True)
class RuntimeAssert:
    """A fact the wrapper checks once every symbol of ``expr`` is bound."""

    expr: sympy.Basic
    message: str


@dataclasses.dataclass
class UnbackedDefs:
    """The unbacked symbols of one graph: the buffer each is read from, and the asserts."""

    defined_by: dict[sympy.Symbol, str] = dataclasses.field(default_factory=dict)
    asserts: list[RuntimeAssert] = dataclasses.field(default_factory=list)


def _define(sym: sympy.Symbol, binding: symbolic.SizeBinding) -> None:
    graph = V.graph
    graph.size_bindings[sym] = binding
    graph.unbacked.defined_by[sym] = binding.name


def read_scalar(x: Any, val: torch.SymInt | torch.SymFloat | torch.SymBool) -> sympy.Expr:
    """``aten._local_scalar_dense(x)`` (``t.item()``): an extern call whose result the
    wrapper binds to the value's unbacked symbol."""
    if isinstance(val, torch.SymBool):  # a relation over its symbol (Eq(u0, 1)), no size
        raise StaticShapesOnly(f"item() of a bool tensor {x}")
    expr = V.graph.note_symbols(val)
    if not isinstance(x, TensorBox) or not (
        isinstance(expr, sympy.Symbol) and symbolic.is_unbacked(expr)
    ):
        msg = f"item() of {x} as {expr}: not a fresh value read from data"
        raise StaticShapesOnly(msg)
    source = realize_as_tensor(x, "input of item()")
    handle = Layout(x.get_device(), torch.uint8, (), ())  # a Python number, not a tensor
    op = aten._local_scalar_dense.default
    buf = ExternBuffer("", handle, op=op, args=(source,), multi_output=True)
    V.graph.register_buffer(buf)
    _define(expr, symbolic.SizeBinding(buf.name, None))
    return expr


def bind_new_outputs(traced: Any, new: Iterable[Buffer]) -> None:
    """Bind each unbacked symbol that is a whole dimension of an extern result among
    ``new`` (the buffers one node's lowering registered), noting the hints of the symbols
    of ``traced`` (the node's value) first."""
    for leaf in pytree.tree_leaves(traced):
        if isinstance(leaf, torch.Tensor):
            for n in (*leaf.shape, *leaf.stride()):
                if isinstance(n, torch.SymInt):
                    V.graph.note_symbols(n)
    for buf in new:
        if not isinstance(buf, (ExternBuffer, MultiOutput)):
            continue
        for d, n in enumerate(buf.layout.size):
            if symbolic.is_unbacked(n) and n not in V.graph.size_bindings:
                _define(n, symbolic.SizeBinding(buf.name, d))


def condition(val: torch.SymBool) -> Condition:
    """A symbolic bool node's relation, in loopir's size functions."""
    expr = getattr(getattr(val, "node", None), "expr", None)
    if not isinstance(expr, sympy.Basic):
        msg = f"a symbolic bool {val} without an expression"
        raise StaticShapesOnly(msg)
    return Condition(_from_capture(expr))


def runtime_assert(cond: Any, message: Any) -> None:
    """``aten._assert_scalar``: a fact of the data capture assumed, checked per call (even
    where the ranges prove it: they were narrowed by this very assert)."""
    if cond is True or cond is sympy.true:
        return
    if not isinstance(cond, Condition):
        msg = f"a runtime assert of {cond!r}"
        raise StaticShapesOnly(msg)
    V.graph.unbacked.asserts.append(RuntimeAssert(cond.expr, str(message)))


def refuse_conditions(node: Any, arguments: Any) -> None:
    """Raise ``StaticShapesOnly`` where an op other than an assert takes a symbolic bool."""
    if any(isinstance(a, Condition) for a in pytree.tree_leaves(arguments)):
        msg = f"{node.format_node()}: a symbolic bool as an argument"
        raise StaticShapesOnly(msg)


def _from_capture(expr: sympy.Basic) -> sympy.Basic:
    if isinstance(expr, (sympy.And, sympy.Or, sympy.Not)):
        return expr.func(*[_from_capture(a) for a in expr.args])
    if isinstance(expr, sympy.core.relational.Relational):
        return expr.func(symbolic.from_capture(expr.lhs), symbolic.from_capture(expr.rhs))
    if expr is sympy.true or expr is sympy.false:
        return expr
    msg = f"a symbolic bool {expr} ({type(expr).__name__}) is not a relation of sizes"
    raise StaticShapesOnly(msg)


_RELATIONS = {
    sympy.Eq: "==",
    sympy.Ne: "!=",
    sympy.Lt: "<",
    sympy.Le: "<=",
    sympy.Gt: ">",
    sympy.Ge: ">=",
}


def assert_source(expr: sympy.Basic, printer: Any) -> str:
    """Python for ``expr`` (a relation of sizes, or ``And``/``Or``/``Not`` of them), with
    sizes printed by ``printer`` (the wrapper's)."""
    if expr is sympy.true or expr is sympy.false:
        return str(bool(expr))
    if isinstance(expr, sympy.Not):
        return f"not ({assert_source(expr.args[0], printer)})"
    if isinstance(expr, (sympy.And, sympy.Or)):
        joiner = " and " if isinstance(expr, sympy.And) else " or "
        return joiner.join(f"({assert_source(a, printer)})" for a in expr.args)
    op = _RELATIONS.get(type(expr))
    if op is None:
        msg = f"a runtime assert of {expr} ({type(expr).__name__})"
        raise StaticShapesOnly(msg)
    lhs, rhs = expr.args  # type: ignore[attr-defined]
    return f"{printer.print(lhs)} {op} {printer.print(rhs)}"


def symbols_used(buf: Buffer) -> set[sympy.Symbol]:
    """The unbacked symbols ``buf``'s producer needs bound before it runs."""
    exprs: list[Any] = [*buf.layout.size, *buf.layout.stride, buf.layout.offset]
    if isinstance(buf, ComputedBuffer):
        data = buf.data
        exprs += [*data.get_size(), data.numel()]
        handler = ReadWriteHandler()
        with set_ops_handler(handler):
            if isinstance(data, Reduction):
                exprs.append(data.reduction_numel())
                KernelNode(buf, "xr", data.reduction_numel()).body(XINDEX, RINDEX)
            else:
                KernelNode(buf, "x", sympy.S.One).body(XINDEX, None)
        exprs += handler.addresses()
    elif isinstance(buf, ExternBuffer):
        for leaf in pytree.tree_leaves((buf.args, buf.kwargs)):
            if isinstance(leaf, ReinterpretView):
                lay = leaf.layout
                exprs += [*lay.size, *lay.stride, lay.offset]
            elif isinstance(leaf, sympy.Basic):
                exprs.append(leaf)
    found = symbolic.size_symbols(e for e in exprs if isinstance(e, sympy.Basic))
    return {s for s in found if symbolic.is_unbacked(s)}
