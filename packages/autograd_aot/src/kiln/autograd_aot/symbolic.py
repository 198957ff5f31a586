"""Symbolic sizes in ATen graphs: reading them from graph inputs, and their hints.

A graph traced over fakes with symbolic sizes (``kiln.capture.shapes``) is compiled once for
every size its guards admit, so an op's size argument (``view(x, [s0 * 4, s1])``) cannot be a
number in the graph: it becomes nodes that compute it at run time from the inputs' sizes,
``aten.sym_size.int(x, 0)`` for a symbol and ``operator`` calls for the arithmetic over them,
each with its ``SymInt`` as ``meta["val"]``. The arithmetic is capture's ``Materializer`` (the
same nodes capture's graphs hold); :class:`SymbolReader` says where this graph reads each
symbol: from its inputs' sizes, one node per expression.

Costs (the partitioner's saved bytes) take the hints, the sizes of the call being compiled:
asking a symbolic value for a Python number would record a guard in the shape environment
and specialize the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.autograd_aot.errors import AotError
from kiln.capture.meta import FakeTensor
from kiln.capture.shapes import ShapeEnv, SymNode, expr_of, has_symbolic_sizes, wrap
from kiln.capture.shapes.materialize import CannotMaterialize, WithDivision

__all__ = [
    "SizeSources",
    "SymbolReader",
    "symbol_reads",
    "as_exprs",
    "concrete",
    "has_symbolic",
    "size_sources",
    "fresh_fake",
    "from_data",
    "hint",
    "is_symbolic",
    "is_symbolic_value",
]

aten = torch.ops.aten

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic_value(value: object) -> bool:
    """A ``SymInt``/``SymFloat``/``SymBool`` that is not a number in disguise."""
    return isinstance(value, _SYM_TYPES) and bool(_expr(value).free_symbols)


def from_data(value: object) -> bool:
    """A symbolic number computed from tensor data (over unbacked symbols: ``item()``)."""
    if not is_symbolic_value(value):
        return False
    env: ShapeEnv = value.node.env  # type: ignore[attr-defined]
    return env.is_unbacked(_expr(value))


def _expr(value: Any) -> sympy.Basic:
    return expr_of(value)


def is_symbolic(t: object) -> bool:
    """A tensor with a symbolic size or stride."""
    return isinstance(t, torch.Tensor) and has_symbolic_sizes(t)


def hint(value: Any) -> Any:
    """``value``'s number in the call being compiled, without a guard (a plain number as is)."""
    if not isinstance(value, _SYM_TYPES):
        return value
    found = value.node.hint
    if found is None:  # computed from data (an unbacked size): a guess serves for costs
        env: ShapeEnv = value.node.env  # type: ignore[attr-defined]
        guesses = dict.fromkeys(env.unbacked, sympy.Integer(_UNBACKED_GUESS))
        found = env.size_hint(_expr(value).xreplace(guesses))
    return found


# what an unbacked size (``nonzero``'s row count) counts as in cost estimates
_UNBACKED_GUESS = 64


def fresh_fake(template: torch.Tensor, device: torch.device, requires_grad: bool) -> FakeTensor:
    """A new fake with ``template``'s symbolic sizes and strides (its own storage)."""
    meta = template.meta if isinstance(template, FakeTensor) else template
    with torch._C._DisableTorchDispatch():
        fresh = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device="meta")
    return FakeTensor(fresh, device, requires_grad=requires_grad)


def _value_of(expr: sympy.Basic, env: ShapeEnv) -> Any:
    """The torch value (``SymInt``, ...) standing for ``expr`` in ``env``."""
    if isinstance(expr, sympy.logic.boolalg.Boolean):
        pytype: type = bool
    elif expr.is_integer:
        pytype = int
    else:
        pytype = float
    hint = env.hint_or_none(expr)
    return wrap(SymNode(expr, env, pytype, None if hint is None else pytype(hint)))


class SymbolReader:
    """Graph nodes for the symbolic values an ATen graph's ops take, read from its inputs.

    A symbol is read from the first input that has it as a size, by ``aten.sym_size.int``
    (matched by expression: the env's sources name the user's tensors, not this graph's
    inputs), or is an input itself (a saved size); capture's ``Materializer`` builds the
    arithmetic over them, one node per expression.
    """

    def __init__(self, graph: fx.Graph, inputs: Callable[[], Iterable[tuple[fx.Node, Any]]]):
        self.graph = graph
        self.inputs = inputs
        self._env: ShapeEnv | None = None
        self._materialize = WithDivision(self._leaf, self._create)

    def node_for(self, value: Any) -> Any:
        """``value``, or the node computing it when it is symbolic."""
        if not is_symbolic_value(value):
            return value
        self._env = value.node.env
        made = self._computed(_expr(value)) if from_data(value) else None
        if made is not None:  # an op's own value (a bool's item(): ``Eq(u0, 1)``)
            return made
        try:
            return self._materialize(_expr(value))
        except CannotMaterialize as e:
            msg = f"the symbolic size {value} has no graph form ({e}); mark its sizes static"
            raise AotError(msg) from e

    def _create(self, target: Any, args: tuple[Any, ...], expr: sympy.Basic) -> fx.Node:
        node = self.graph.call_function(target, args)
        assert self._env is not None
        node.meta["val"] = _value_of(expr, self._env)
        return node

    def _leaf(self, symbol: sympy.Symbol) -> fx.Node:
        for node, val in self.inputs():
            if is_symbolic_value(val) and _expr(val) == symbol:
                return node
            if not isinstance(val, torch.Tensor):
                continue
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and _expr(size) == symbol:
                    read = self.graph.call_function(aten.sym_size.int, (node, d))
                    read.meta["val"] = size
                    return read
        found = self._computed(symbol)
        if found is not None:
            return found
        msg = f"the size symbol {symbol} is not a size of any input of the graph"
        raise AotError(msg)

    def _computed(self, symbol: sympy.Basic) -> fx.Node | None:
        """The node reading an unbacked symbol (or value) from the op that made it: its
        scalar result (``item()``) or a size of its tensor result (``nonzero``)."""
        for node in self.graph.nodes:
            val = node.meta.get("val")
            if is_symbolic_value(val) and _expr(val) == symbol:
                return node  # type: ignore[no-any-return]
            if node.op == "call_function" and isinstance(val, torch.Tensor):
                for d, size in enumerate(val.shape):
                    if isinstance(size, torch.SymInt) and _expr(size) == symbol:
                        with self.graph.inserting_after(node):
                            read = self.graph.call_function(aten.sym_size.int, (node, d))
                        read.meta["val"] = size
                        return read  # type: ignore[no-any-return]
        return None


SizeSources = tuple[tuple[sympy.Symbol, int, int], ...]


def size_sources(inputs: Sequence[Any]) -> SizeSources:
    """Where each symbol of the inputs' sizes is read: (symbol, input position, dim); dim -1
    for an input that is a symbolic number itself."""
    found: dict[sympy.Symbol, tuple[int, int]] = {}
    for i, t in enumerate(inputs):
        if is_symbolic_value(t) and isinstance(_expr(t), sympy.Symbol):
            found.setdefault(_expr(t), (i, -1))
        for d, size in enumerate(t.shape if isinstance(t, torch.Tensor) else ()):
            expr = _expr(size) if isinstance(size, torch.SymInt) else None
            if isinstance(expr, sympy.Symbol):
                found.setdefault(expr, (i, d))
    return tuple((s, i, d) for s, (i, d) in found.items())


def has_symbolic(tree: Any) -> bool:
    """Whether a nest of values (an op's arguments) holds a symbolic number."""
    return any(map(is_symbolic_value, pytree.tree_leaves(tree)))


def as_exprs(tree: Any) -> Any:
    """``tree`` with each symbolic number replaced by its sympy expression: what a program
    keeps to evaluate later (picklable, unlike a ``SymInt``, and tied to no trace)."""
    return pytree.tree_map(lambda a: _expr(a) if is_symbolic_value(a) else a, tree)


def concrete(tree: Any, sources: SizeSources, inputs: Sequence[torch.Tensor]) -> Any:
    """``tree`` (made by :func:`as_exprs`) with each expression replaced by its value for these
    ``inputs`` (the runtime's, whose sizes ``sources`` reads): what a view rebuilt outside a
    compiled graph takes. A sympy substitution per value: for the rare output that views an
    input."""
    values = {s: sympy.sympify(inputs[i] if d < 0 else inputs[i].shape[d]) for s, i, d in sources}

    def value(a: Any) -> Any:
        if not isinstance(a, sympy.Basic):
            return a
        number = a.xreplace(values)
        if number.free_symbols:
            msg = f"the symbolic value {a} is not computed from the inputs' sizes"
            raise AotError(msg)
        if number in (sympy.true, sympy.false):
            return bool(number)
        return int(number) if number.is_integer else float(number)

    return pytree.tree_map(value, tree)


def symbol_reads(values: Sequence[Any]) -> list[tuple[int, int | None, Any]]:
    """Where a call's inputs hold each symbol of ``values`` (the traced inputs' fakes and
    symbolic numbers), once per symbol: ``(input, dim, SymInt)``, dim None for a number input.
    The runtime reads these values per call for a backward that needs a symbol no tensor it
    gets carries."""
    seen: set[sympy.Basic] = set()
    out: list[tuple[int, int | None, Any]] = []
    for i, v in enumerate(values):
        if is_symbolic_value(v) and _expr(v).is_Symbol and _expr(v) not in seen:
            seen.add(_expr(v))
            out.append((i, None, v))
        if not isinstance(v, torch.Tensor):
            continue
        for d, size in enumerate(v.shape):
            if is_symbolic_value(size) and _expr(size).is_Symbol and _expr(size) not in seen:
                seen.add(_expr(size))
                out.append((i, d, size))
    return out
