"""Symbolic sizes: the capture's size symbols as loopir sees them.

A graph captured with dynamic shapes carries fake tensors whose sizes are ``SymInt`` s over
one ``kiln.capture.shapes.ShapeEnv``. loopir keeps their sympy expressions in layouts and
index expressions (capture's ``FloorDiv``/``Mod`` become :mod:`kiln.loopir.sizes`' own), so a
compiled graph serves every size its guards admit. Where a decision needs a number (memory
accounting, heuristics), :func:`hint` gives the size of the call being compiled, without a
guard: such a decision only makes the program faster or slower, never wrong. What needs a
number for correctness raises :class:`~kiln.loopir.errors.StaticShapesOnly`.

The wrapper reads each size symbol once per call from a graph input (:class:`SizeBinding`).
A Python number the graph takes as an input (a ``SymInt`` or ``SymFloat`` placeholder: a scale,
a float computed from data before a graph break) is bound the same way and reaches kernels as
a scalar argument; a float one is a *number symbol* (:func:`is_number_symbol`), real-valued,
which no size or index expression holds.

A value computed from tensor data (``nonzero``'s row count, ``t.item()``) is an *unbacked*
symbol (``u0``, :func:`is_unbacked`): no input carries it, so the wrapper binds it right after
the extern call that makes it (``u0 = buf3.shape[0]``, ``u1 = buf5`` for an ``item()``), and
every later allocation, kernel and size argument reads it as any size symbol. Its hint is
:data:`UNBACKED_HINT` within its range: no call being compiled knows its value.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator, Mapping

import sympy
import torch

from kiln.capture.shapes import exprs as capture_exprs
from kiln.loopir.errors import StaticShapesOnly

__all__ = [
    "SizeBinding",
    "SizeFacts",
    "facts",
    "from_capture",
    "hint",
    "in_symbolic_graph",
    "is_number_symbol",
    "is_symbolic",
    "is_unbacked",
    "unbacked_hint",
    "unbacked_in",
    "lower_bound",
    "provably",
    "size_symbols",
]

SIZE_PREFIX = "s"
"""Capture names its size symbols ``s0, s1, ...``; loopir's index symbols use other prefixes."""
UNBACKED_PREFIX = "u"
"""... and the symbols of values computed from data ``u0, u1, ...``."""
UNBACKED_HINT = 8192
"""The size heuristics assume for an unbacked symbol (Inductor's choice too): large enough
that tiling and parallel decisions take the general path, which is correct for any size."""


@dataclasses.dataclass(frozen=True)
class SizeFacts:
    """What is known of the size symbols of the graph being compiled: each one's value in
    this call (``hints``) and the range every call's value lies in (``ranges``: the shape
    environment's, which its guards check)."""

    hints: Mapping[sympy.Symbol, int | float]
    ranges: Mapping[sympy.Symbol, capture_exprs.Range]


_facts: contextvars.ContextVar[SizeFacts | None] = contextvars.ContextVar(
    "kiln_loopir_size_facts", default=None
)


@dataclasses.dataclass(frozen=True)
class SizeBinding:
    """Where the wrapper reads a size symbol: dimension ``dim`` of input ``name``, or the
    input itself (an int a backward receives, a number input) when ``dim`` is None; for a
    float the graph computes from its number inputs, ``name`` is the Python computing it."""

    name: str
    dim: int | None

    def source(self) -> str:
        """Python that reads the value in the wrapper."""
        return self.name if self.dim is None else f"{self.name}.shape[{self.dim}]"


def from_capture(expr: sympy.Basic) -> sympy.Expr:
    """A capture size expression in loopir's terms (its integer functions).

    Raises ``StaticShapesOnly`` for what loopir's index expressions cannot hold.
    """
    if not isinstance(expr, sympy.Expr):
        msg = f"size {expr} is not an integer expression"
        raise StaticShapesOnly(msg)
    if expr.is_Atom:
        return expr
    if isinstance(expr, capture_exprs.FloorDiv):
        from kiln.loopir.sizes import FloorDiv

        return FloorDiv(from_capture(expr.args[0]), from_capture(expr.args[1]))
    if isinstance(expr, capture_exprs.Mod):
        from kiln.loopir.sizes import ModularIndexing

        return ModularIndexing(from_capture(expr.args[0]), sympy.S.One, from_capture(expr.args[1]))
    if isinstance(expr, (sympy.Add, sympy.Mul)) or (
        isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0
    ):
        return expr.func(*[from_capture(a) for a in expr.args])
    if isinstance(expr, (sympy.Max, sympy.Min)):
        return _max_min(expr.func, [from_capture(a) for a in expr.args])
    msg = f"size expression {expr} ({type(expr).__name__}) is not supported symbolically"
    raise StaticShapesOnly(msg)


def _max_min(func: type, args: list[sympy.Expr]) -> sympy.Expr:
    """``Max``/``Min`` of sizes, resolved where the ranges decide it for every admitted size
    (a convolution's ``Max(1, (s - 1) // 2 + 1)`` is its second argument); kept where a
    value computed from data decides it (``x[:n]`` of ``n = t.item()``: ``Min(12, u0)``)."""
    is_max = func is sympy.Max
    for pick in args:
        others = [a for a in args if a is not pick]
        if all(_at_least(pick, o) if is_max else _at_least(o, pick) for o in others):
            return pick
    if any(is_unbacked(s) for a in args for s in a.free_symbols):
        return func(*args)  # type: ignore[no-any-return]  # only the data decides: computed per call
    msg = f"{func.__name__}{tuple(args)} of sizes is not decided for every size"
    raise StaticShapesOnly(msg)


def _at_least(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether ``a >= b`` for every admitted size (``b`` an integer, or ``a - b`` bounded)."""
    return lower_bound(a - b) >= 0


def is_symbolic(expr: sympy.Basic | int) -> bool:
    """Whether ``expr`` holds a size symbol."""
    return isinstance(expr, sympy.Basic) and bool(size_symbols([expr]))


def size_symbols(exprs: Iterable[sympy.Basic | int]) -> set[sympy.Symbol]:
    """The size symbols (not index symbols) in ``exprs``."""
    found: set[sympy.Symbol] = set()
    for expr in exprs:
        if isinstance(expr, sympy.Basic):
            found |= {s for s in expr.free_symbols if _is_size_symbol(s)}
    return found


def is_number_symbol(sym: sympy.Basic) -> bool:
    """Whether ``sym`` is the symbol of a Python float input: a kernel takes its value as a
    ``double``, never as an index."""
    return _is_size_symbol(sym) and sym.is_integer is not True


def is_unbacked(sym: sympy.Basic) -> bool:
    """Whether ``sym`` is the symbol of a value computed from tensor data (``u0``)."""
    return isinstance(sym, sympy.Symbol) and sym.name[:1] == UNBACKED_PREFIX and _numbered(sym)


def unbacked_in(value: object) -> bool:
    """Whether a traced value (a fake tensor's sizes and strides, a number, or a tuple of
    them) holds an unbacked symbol."""
    leaves = value if isinstance(value, (tuple, list)) else [value]
    for leaf in leaves:
        if isinstance(leaf, (tuple, list)):
            if unbacked_in(leaf):
                return True
            continue
        items = (*leaf.shape, *leaf.stride()) if isinstance(leaf, torch.Tensor) else (leaf,)
        for n in items:
            expr = getattr(getattr(n, "node", None), "expr", None)
            if isinstance(expr, sympy.Basic) and any(is_unbacked(s) for s in expr.free_symbols):
                return True
    return False


def unbacked_hint(values: capture_exprs.Range) -> int:
    """The hint of an unbacked integer whose values lie in ``values``."""
    return int(min(max(UNBACKED_HINT, values.lower), values.upper))


def _is_size_symbol(sym: sympy.Basic) -> bool:
    prefixes = (SIZE_PREFIX, UNBACKED_PREFIX)
    return isinstance(sym, sympy.Symbol) and sym.name[:1] in prefixes and _numbered(sym)


def _numbered(sym: sympy.Symbol) -> bool:
    return sym.name[1:].isdigit()


@contextlib.contextmanager
def facts(known: SizeFacts) -> Iterator[None]:
    """What :func:`hint` and :func:`lower_bound` read within (the mappings may still grow)."""
    token = _facts.set(known)
    try:
        yield
    finally:
        _facts.reset(token)


def in_symbolic_graph() -> bool:
    """Whether the graph being compiled has size symbols."""
    known = _facts.get()
    return known is not None and bool(known.hints)


def lower_bound(expr: sympy.Expr | int) -> float:
    """The least value ``expr`` takes in any call the guards admit (``-inf`` if unknown)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    known = _facts.get()
    if known is None:
        return -capture_exprs.INF
    from kiln.loopir.sizes import FloorDiv, ModularIndexing

    def to_capture(e: sympy.Expr) -> sympy.Expr:
        if isinstance(e, FloorDiv):
            return capture_exprs.FloorDiv(*[to_capture(a) for a in e.args])
        if isinstance(e, ModularIndexing):
            num, div, mod = (to_capture(a) for a in e.args)
            return capture_exprs.Mod(capture_exprs.FloorDiv(num, div), mod)
        if isinstance(e, sympy.Function):
            raise _Unbounded
        return e.func(*[to_capture(a) for a in e.args]) if e.args else e

    try:
        expr = to_capture(expr)
    except _Unbounded:
        return -capture_exprs.INF
    ranges = {s: known.ranges.get(s, _ANY) for s in expr.free_symbols}
    return capture_exprs.bounds(expr, ranges).lower


class _Unbounded(Exception):
    """An expression :func:`lower_bound` does not bound."""


_ANY = capture_exprs.Range(-capture_exprs.INF, capture_exprs.INF)


def provably(relation: sympy.Basic) -> bool:
    """Whether ``lhs >= rhs`` / ``lhs > rhs`` holds in every admitted call (a sympy ``Ge`` or
    ``Gt`` over sizes); False when it cannot be shown, whatever the hints say."""
    if relation is sympy.true or relation is sympy.false:
        return bool(relation)
    diff = relation.lhs - relation.rhs  # type: ignore[attr-defined]
    low = lower_bound(diff)
    return low > 0 if isinstance(relation, sympy.StrictGreaterThan) else low >= 0


def hint(expr: sympy.Expr | int) -> int:
    """``expr``'s value in the call being compiled: for a decision that only tunes the
    program (memory accounting, heuristics), never for one its correctness rests on."""
    if isinstance(expr, int):
        return expr
    if expr.is_Integer:
        return int(expr)
    known = _facts.get()
    if known is None:
        msg = f"size {expr} is symbolic and no size hints are known"
        raise StaticShapesOnly(msg)
    found = sympy.sympify(sympy.sympify(expr).xreplace(dict(known.hints)))
    if not found.is_Integer:
        msg = f"size {expr} has a symbol without a hint"
        raise StaticShapesOnly(msg)
    return int(found)
