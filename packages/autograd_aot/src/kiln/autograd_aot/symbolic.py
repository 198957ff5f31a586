"""Symbolic sizes in ATen graphs: reading them from graph inputs, and their hints.

A graph traced over fakes with symbolic sizes (``kiln.capture.shapes``) is compiled once for
every size its guards admit, so an op's size argument (``view(x, [s0 * 4, s1])``) cannot be a
number in the graph: it becomes nodes that compute it at run time from the inputs' sizes,
``aten.sym_size.int(x, 0)`` for a symbol and ``operator`` calls for the arithmetic over them,
each with its ``SymInt`` as ``meta["val"]``. :func:`expr_nodes` turns a sympy expression into
such nodes, given where each symbol is read; it knows nothing of tracing, so capture could
build its graphs' size arithmetic with it too. :class:`SymbolReader` is the tracer's use of it:
symbols read from the graph's placeholders, one node per expression.

Costs (the partitioner's saved bytes) take the hints, the sizes of the call being compiled:
asking a symbolic value for a Python number would record a guard in the shape environment
and specialize the graph.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.autograd_aot.errors import AotError
from kiln.capture.meta import FakeTensor
from kiln.capture.shapes import FloorDiv, Mod, SymNode, expr_of, has_symbolic_sizes, wrap

__all__ = [
    "SizeSources",
    "SymbolReader",
    "concrete",
    "has_symbolic",
    "size_sources",
    "expr_nodes",
    "fresh_fake",
    "hint",
    "is_symbolic",
    "is_symbolic_value",
]

aten = torch.ops.aten

SymValue = torch.SymInt | torch.SymFloat | torch.SymBool
_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_RELATIONS: dict[type, Callable[[Any, Any], Any]] = {
    sympy.Eq: operator.eq,
    sympy.Ne: operator.ne,
    sympy.Lt: operator.lt,
    sympy.Le: operator.le,
    sympy.Gt: operator.gt,
    sympy.Ge: operator.ge,
}
_FUNCTIONS: dict[type, Callable[..., Any]] = {
    FloorDiv: operator.floordiv,
    Mod: operator.mod,
    sympy.Min: torch.sym_min,
    sympy.Max: torch.sym_max,
}


def is_symbolic_value(value: object) -> bool:
    """A ``SymInt``/``SymFloat``/``SymBool`` that is not a number in disguise."""
    return isinstance(value, _SYM_TYPES) and bool(_expr(value).free_symbols)


def _expr(value: Any) -> sympy.Basic:
    return expr_of(value)


def is_symbolic(t: object) -> bool:
    """A tensor with a symbolic size or stride."""
    return isinstance(t, torch.Tensor) and has_symbolic_sizes(t)


def hint(value: Any) -> Any:
    """``value``'s number in the call being compiled, without a guard (a plain number as is)."""
    if isinstance(value, _SYM_TYPES):
        node = value.node
        if isinstance(node, SymNode):
            return node.hint
        return node.hint  # another SymNode implementation with a hint
    return value


def fresh_fake(template: torch.Tensor, device: torch.device, requires_grad: bool) -> FakeTensor:
    """A new fake with ``template``'s symbolic sizes and strides (its own storage)."""
    meta = template.meta if isinstance(template, FakeTensor) else template
    with torch._C._DisableTorchDispatch():
        fresh = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device="meta")
    return FakeTensor(fresh, device, requires_grad=requires_grad)


def _value_of(expr: sympy.Basic, like: SymNode) -> Any:
    """The torch value (``SymInt``, ...) standing for ``expr`` in ``like``'s environment."""
    env = like.env
    if isinstance(expr, sympy.logic.boolalg.Boolean):
        pytype: type = bool
    elif expr.is_integer:
        pytype = int
    else:
        pytype = float
    return wrap(SymNode(expr, env, pytype, pytype(env.size_hint(expr))))


def expr_nodes(
    graph: fx.Graph,
    expr: sympy.Basic,
    leaf: Callable[[sympy.Symbol], fx.Node],
    memo: dict[sympy.Basic, fx.Node],
    value_of: Callable[[sympy.Basic], Any],
) -> fx.Node | int | float | bool:
    """Nodes of ``graph`` computing ``expr``: ``leaf(symbol)`` reads a symbol, sums, products,
    ``//``, ``%``, min/max and comparisons become ``operator`` (``torch.sym_*``) calls, numbers
    stay numbers. Each node's ``meta["val"]`` is ``value_of(its expression)``; ``memo`` holds
    the nodes made so far (and any the caller seeded it with), so an expression is computed
    once per graph."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Number:
        return float(expr)
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    found = memo.get(expr)
    if found is not None:
        return found

    def rec(e: sympy.Basic) -> fx.Node | int | float | bool:
        return expr_nodes(graph, e, leaf, memo, value_of)

    node = leaf(expr) if isinstance(expr, sympy.Symbol) else _compound(graph, expr, rec)
    if "val" not in node.meta:
        node.meta["val"] = value_of(expr)
    memo[expr] = node
    return node


def _compound(graph: fx.Graph, expr: sympy.Basic, rec: Callable[[sympy.Basic], Any]) -> fx.Node:
    """One node for ``expr`` over the nodes of smaller expressions (each folded step is an
    expression of its own, so every node has a value and is shared where it recurs)."""

    def call(fn: Callable[..., Any], *args: sympy.Basic | int) -> fx.Node:
        return graph.call_function(
            fn, tuple(rec(a) if isinstance(a, sympy.Basic) else a for a in args)
        )

    if isinstance(expr, sympy.Add):
        # subtract the negative terms: ``s0 - s1``, not ``s0 + s1 * -1``
        terms = sorted(expr.args, key=lambda t: (t.could_extract_minus_sign(), t.is_Number))
        last, rest = terms[-1], sympy.Add(*terms[:-1])
        if last.could_extract_minus_sign() and not rest.could_extract_minus_sign():
            return call(operator.sub, rest, -last)
        return call(operator.add, rest, last)
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        if coeff == -1:
            return call(operator.neg, rest)
        if not coeff.is_Integer:
            return _unsupported(expr)
        if coeff != 1:
            return call(operator.mul, rest, int(coeff))
        factors = sympy.Mul.make_args(expr)
        return call(operator.mul, sympy.Mul(*factors[:-1]), factors[-1])
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 1:
        return call(operator.mul, expr.base ** (int(expr.exp) - 1), expr.base)
    fn = _FUNCTIONS.get(type(expr)) or _RELATIONS.get(type(expr))
    if fn is None:
        return _unsupported(expr)
    if len(expr.args) > 2:  # Min and Max may hold more than two
        return call(fn, type(expr)(*expr.args[:-1]), expr.args[-1])
    return call(fn, *expr.args)


def _unsupported(expr: sympy.Basic) -> fx.Node:
    msg = f"a symbolic size {expr} has no graph form ({type(expr).__name__}); mark it static"
    raise AotError(msg)


class SymbolReader:
    """Graph nodes for the symbolic values an ATen graph's ops take, read from its inputs.

    A symbol is read from the first input that has it as a size, by ``aten.sym_size.int``
    (matched by expression: the env's sources name the user's tensors, not this graph's
    inputs); an input that is a symbolic number itself answers its own expression.
    """

    def __init__(self, graph: fx.Graph, inputs: Callable[[], Iterable[tuple[fx.Node, Any]]]):
        self.graph = graph
        self.inputs = inputs
        self.memo: dict[sympy.Basic, fx.Node] = {}
        self._seen: set[fx.Node] = set()

    def node_for(self, value: Any) -> Any:
        """``value``, or the node computing it when it is symbolic."""
        if not is_symbolic_value(value):
            return value
        self._seed()
        like = value.node
        return expr_nodes(
            self.graph, _expr(value), self._leaf, self.memo, lambda e: _value_of(e, like)
        )

    def _seed(self) -> None:
        for node, val in self.inputs():
            if node not in self._seen and is_symbolic_value(val):
                self.memo.setdefault(_expr(val), node)
            self._seen.add(node)

    def _leaf(self, symbol: sympy.Symbol) -> fx.Node:
        for node, val in self.inputs():
            if not isinstance(val, torch.Tensor):
                continue
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and expr_of(size) == symbol:
                    read = self.graph.call_function(aten.sym_size.int, (node, d))
                    read.meta["val"] = size
                    return read
        msg = f"the size symbol {symbol} is not a size of any input of the graph"
        raise AotError(msg)


SizeSources = tuple[tuple[sympy.Symbol, int, int], ...]


def size_sources(inputs: Sequence[Any]) -> SizeSources:
    """Where each symbol of the inputs' sizes is read: (symbol, input position, dim)."""
    found: dict[sympy.Symbol, tuple[int, int]] = {}
    for i, t in enumerate(inputs):
        for d, size in enumerate(t.shape if isinstance(t, torch.Tensor) else ()):
            expr = _expr(size) if isinstance(size, torch.SymInt) else None
            if isinstance(expr, sympy.Symbol):
                found.setdefault(expr, (i, d))
    return tuple((s, i, d) for s, (i, d) in found.items())


def has_symbolic(tree: Any) -> bool:
    """Whether a nest of values (an op's arguments) holds a symbolic number."""
    return any(map(is_symbolic_value, pytree.tree_leaves(tree)))


def concrete(tree: Any, sources: SizeSources, inputs: Sequence[torch.Tensor]) -> Any:
    """``tree`` with each symbolic number replaced by its value for these ``inputs`` (the
    runtime's, whose sizes ``sources`` reads): what a view rebuilt outside a compiled graph
    takes. A sympy substitution per value: for the rare output that views an input."""
    values = {s: sympy.Integer(inputs[i].shape[d]) for s, i, d in sources}

    def value(a: Any) -> Any:
        if not is_symbolic_value(a):
            return a
        number = _expr(a).xreplace(values)
        if number.free_symbols:
            msg = f"the symbolic value {a} is not computed from the inputs' sizes"
            raise AotError(msg)
        return bool(number) if number in (sympy.true, sympy.false) else int(number)

    return pytree.tree_map(value, tree)
