"""The shape environment: symbols for input sizes, their sources, hints and ranges, and the
guards every decision on them adds (the PyTorch 2 paper, section 5).

A trace is specialized to one branch of every decision: asked whether ``s0 > 16``, the
environment answers from the hints (the sizes of the call being compiled) and records the
relation it assumed, so the compiled code is reused exactly when every relation holds again.
Facts known without a guard are answered from value ranges (every unspecialized size is at
least 2, so ``s0 == 1`` is False and ``s0 >= 2`` True), and guards refine what is known:
``s1 == s0`` replaces ``s1`` by ``s0`` everywhere, ``int(s2)`` replaces ``s2`` by its value,
``s0 > 16`` raises ``s0``'s lower bound.

Unbacked symbols (``u0``) stand for values computed from tensor data (``t.item()``, the row
count of ``nonzero``): they have no source and no hint, only a range, so a question their
range does not decide cannot be answered (:class:`DataDependentGuard`), and no guard ever
names them. A fact torch's kernels need of one (``torch._check``, a size at least 0) is
assumed and kept as a runtime assert (:attr:`ShapeEnv.deferred`) for the graph to check.

Every symbol, including one a size was specialized to at creation, has a source, so each
guard is a relation over sources (``L['x'].size()[0] == 1``) for ``kiln.guards`` to check.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable
from typing import Any

import sympy

from kiln.capture.errors import Unsupported
from kiln.capture.shapes.exprs import (
    INF,
    Range,
    bounds,
    decide,
    reduce_by_ranges,
    simplify_relation,
)
from kiln.capture.source import Source

__all__ = ["DataDependentGuard", "ShapeEnv", "ShapeGuard", "SymbolInfo", "Scalar"]

Scalar = int | float | bool


@dataclasses.dataclass
class SymbolInfo:
    """One input size: the sympy symbol, where it is read from, its value in the call being
    compiled, and the values it may take while the compiled code is reused."""

    symbol: sympy.Symbol
    source: Source
    hint: int | float
    range: Range
    # the range given at creation (at least 2, or the user's bounds): reasoning assumed it,
    # so reuse is guarded on it
    declared: Range


@dataclasses.dataclass(frozen=True)
class ShapeGuard:
    """A relation the compiled code assumes (``expr``, a sympy boolean over the env's symbols)
    and the user's line whose decision added it (``file:line``, empty when unknown)."""

    expr: sympy.Basic
    origin: str = ""


class DataDependentGuard(Unsupported):
    """A decision on an expression over unbacked symbols that their ranges do not settle:
    the answer depends on tensor data the trace does not have, so the graph breaks there
    (a ``data_dependent_branch``), never guessing."""

    def __init__(self, expr: sympy.Basic) -> None:
        self.expr = expr
        super().__init__(
            "data_dependent_branch",
            f"control flow depends on {expr}, a value computed from tensor data",
            "use torch.where or tensor ops, or torch._check(...) a fact the code may assume",
        )


class ShapeEnv:
    """Symbols for the sizes of one capture, and the guards decisions on them add.

    ``specialize_zero_one``: sizes 0 and 1 become constants (with a guard), as the paper does:
    broadcasting and contiguity depend on them, and every symbol left is then known to be at
    least 2. ``duck_shape``: a size equal to an existing symbol's hint at creation reuses that
    symbol (with an equality guard), so ``x + y`` of equal sizes needs no broadcast check.
    """

    def __init__(self, *, specialize_zero_one: bool = True, duck_shape: bool = True) -> None:
        self.specialize_zero_one = specialize_zero_one
        self.duck_shape = duck_shape
        self.symbols: dict[sympy.Symbol, SymbolInfo] = {}
        self.replacements: dict[sympy.Symbol, sympy.Expr] = {}
        # each expression with the replacements substituted, until they change
        self._simplified: dict[sympy.Basic, sympy.Basic] = {}
        self._guards: dict[sympy.Basic, ShapeGuard] = {}
        self._by_source: dict[Source, sympy.Expr] = {}
        self._duck: dict[int, sympy.Symbol] = {}
        self._static: dict[sympy.Basic, Scalar | None] = {}
        self._decided: dict[sympy.Basic, Scalar] = {}
        # data-dependent values: each unbacked symbol's range and whether it is a size
        self.unbacked: dict[sympy.Symbol, Range] = {}
        self.size_like: set[sympy.Symbol] = set()
        # relations over unbacked symbols assumed without a guard, for runtime asserts
        self.deferred: list[ShapeGuard] = []
        # ``file:line`` of the program line asking a question, where the caller knows it
        # better than the Python stack does (capture evaluates the user's code itself)
        self.user_line: Callable[[], str] | None = None
        # the result layouts of symbolic op runs, by op and argument metadata (``memo``)
        self.op_results: dict[Any, Any] = {}
        # the expression each arithmetic operation on symbolic values built, by operands
        self.built: dict[Any, sympy.Basic] = {}

    # -- creating symbols ------------------------------------------------------------------

    def create_symbol(
        self,
        hint: int,
        source: Source,
        *,
        dynamic: bool = True,
        min: int | None = None,
        max: int | None = None,
    ) -> sympy.Expr:
        """The expression standing for the size read from ``source`` (``hint`` in this call).

        A fresh symbol when the size is dynamic, at least 2 and not duck-sized; otherwise the
        existing symbol or constant it was specialized to, with the guard that makes it so.
        ``min``/``max`` bound a dynamic size (its range; a size with bounds is never
        duck-sized, so its range stays its own).
        """
        if source in self._by_source:
            return self.simplify(self._by_source[source])
        if hint < 0:
            msg = f"size {source} = {hint} is negative"
            raise ValueError(msg)
        specialize = not dynamic or (self.specialize_zero_one and hint in (0, 1))
        # every size left symbolic after 0/1 specialization is at least 2
        floor = 2 if self.specialize_zero_one else 0
        lower = floor if min is None else builtins.max(min, floor)
        upper = INF if max is None else max
        if not specialize and not lower <= hint <= upper:
            msg = f"{source} = {hint} is outside the range [{lower}, {upper}] it was marked with"
            raise ValueError(msg)
        # a specialized size may be 0, which a positive symbol could never equal
        positive = {"positive": True} if not specialize and lower > 0 else {}
        symbol = sympy.Symbol(f"s{len(self.symbols)}", integer=True, nonnegative=True, **positive)
        bound = Range.point(hint) if specialize else Range(lower, upper)
        self.symbols[symbol] = SymbolInfo(symbol, source, hint, bound, bound)
        self._by_source[source] = symbol
        if specialize:
            self._record(sympy.Eq(symbol, hint), "")
        elif self.duck_shape and min is None and max is None and hint in self._duck:
            self._record(sympy.Eq(symbol, self._duck[hint]), "")
        elif min is None and max is None:
            self._duck[hint] = symbol
        return self.simplify(symbol)

    def create_scalar(self, hint: int | float, source: Source) -> sympy.Expr:
        """A symbol for a Python int or float argument read from ``source`` (``hint`` now):
        any value of its type, never specialized or shared with another at creation."""
        if source in self._by_source:
            return self.simplify(self._by_source[source])
        kind = {"integer": True} if isinstance(hint, int) else {"real": True}
        symbol = sympy.Symbol(f"s{len(self.symbols)}", **kind)
        bound = Range(-INF, INF)
        self.symbols[symbol] = SymbolInfo(symbol, source, hint, bound, bound)
        self._by_source[source] = symbol
        return symbol

    def create_unbacked(
        self, kind: type = int, lower: float = -INF, upper: float = INF, *, size: bool = False
    ) -> sympy.Symbol:
        """A fresh unbacked symbol (``u0``, ``u1``, ...) for a value read from tensor data,
        with the values it may take; ``size``: it is a tensor size (at least 0, and assumed
        at least 2 where torch's size-oblivious reasoning asks)."""
        name = f"u{len(self.unbacked)}"
        # a float from data may be infinite: sympy's reals are finite (``u == inf`` would
        # fold to False), its extended reals are not
        kinds = {"integer": True} if kind in (int, bool) else {"extended_real": True}
        if size:
            kinds["nonnegative"] = True
            lower = builtins.max(lower, 0)
        symbol = sympy.Symbol(name, **kinds)
        self.unbacked[symbol] = Range(lower, upper)
        if size:
            self.size_like.add(symbol)
        return symbol

    def is_unbacked(self, expr: sympy.Basic) -> bool:
        """Whether ``expr`` names an unbacked symbol (its value comes from tensor data)."""
        return bool(self.unbacked) and not expr.free_symbols.isdisjoint(self.unbacked)

    def defer(self, relation: sympy.Basic, origin: str = "") -> None:
        """Assume ``relation`` over unbacked symbols (torch's ``expect_true``): it narrows
        their ranges and becomes a runtime assert of the graph, never a guard."""
        relation = _canonical(reduce_by_ranges(self.simplify(relation), self._ranges()))
        if relation is sympy.true or any(g.expr == relation for g in self.deferred):
            return
        self.deferred.append(ShapeGuard(relation, origin))
        self._refine(relation)
        self._static.clear()

    def hint_or_none(self, expr: sympy.Basic | Scalar) -> Scalar | None:
        """``size_hint``, or None where ``expr`` depends on tensor data."""
        if isinstance(expr, sympy.Basic) and self.is_unbacked(expr):
            return None
        return self.size_hint(expr)

    def source_of(self, symbol: sympy.Symbol) -> Source:
        return self.symbols[symbol].source

    def hint_of(self, symbol: sympy.Symbol) -> int | float:
        return self.symbols[symbol].hint

    def range_of(self, symbol: sympy.Symbol) -> Range:
        """The values ``symbol`` may take; a point for one replaced by a constant."""
        value = self.simplify(symbol)
        if value.is_Integer:
            return Range.point(int(value))
        if isinstance(value, sympy.Symbol):
            if value in self.unbacked:
                return self.unbacked[value]
            return self.symbols[value].range
        return bounds(value, self._ranges())

    def free_symbols(self) -> list[sympy.Symbol]:
        """The symbols that are still free: not replaced by a constant or another symbol."""
        return [s for s in self.symbols if s not in self.replacements]

    # -- answering questions ---------------------------------------------------------------

    def simplify(self, expr: sympy.Basic) -> sympy.Basic:
        """``expr`` with what guards have established substituted (sympy rebuilds each node,
        so ``FloorDiv(s0 * s1, s1)`` becomes ``s0`` on the way)."""
        if not self.replacements:
            return expr
        # every size a meta kernel touches is simplified on each read, and walking an
        # expression for its free symbols costs more than a dict look-up of it
        done = self._simplified.get(expr)
        if done is None:
            if expr.free_symbols & self.replacements.keys():
                done = expr.xreplace(self.replacements)
            else:
                done = expr
            self._simplified[expr] = done
        return done

    def size_hint(self, expr: sympy.Basic | Scalar) -> Scalar:
        """The value ``expr`` has in the call being compiled."""
        if not isinstance(expr, sympy.Basic):
            return expr
        values = {s: number(info.hint) for s, info in self.symbols.items()}
        return _to_python(expr.xreplace(values))

    def static_value(self, expr: sympy.Basic) -> Scalar | None:
        """The value of ``expr`` if what is known decides it for every reuse, else None.
        Answers are cached until a guard teaches the env something (meta kernels ask the same
        questions many times, and bounding a sum several ways is not cheap)."""
        if expr in self._decided:
            return self._decided[expr]
        if expr in self._static:
            return self._static[expr]
        value = self._static_value(expr)
        self._static[expr] = value
        return value

    def _static_value(self, expr: sympy.Basic) -> Scalar | None:
        ranges = self._ranges()
        expr = reduce_by_ranges(self.simplify(expr), ranges)
        if not expr.free_symbols:
            return _to_python(expr)
        if isinstance(expr, sympy.Not):
            inner = self.static_value(expr.args[0])
            return None if inner is None else not inner
        if isinstance(expr, (sympy.And, sympy.Or)):
            values = [self.static_value(a) for a in expr.args]
            decisive = isinstance(expr, sympy.Or)
            if decisive in values:
                return decisive
            return None if None in values else not decisive
        if isinstance(expr, sympy.core.relational.Relational):
            return decide(expr, ranges)
        r = bounds(expr, ranges)
        return int(r.lower) if r.lower == r.upper else None

    def evaluate_expr(
        self, expr: sympy.Basic, hint: Scalar | None = None, origin: str = ""
    ) -> Scalar:
        """Decide ``expr``: its static value if known, else its hint, guarding on the relation
        that gives that answer (``expr`` or its negation for a boolean, ``expr == hint``
        for a number). ``origin`` is the user's ``file:line`` that asked."""
        known = self.static_value(expr)
        if known is not None:
            return known
        if self.is_unbacked(expr):  # no hint to decide by, and no guard may name it
            raise DataDependentGuard(expr)
        value = self.size_hint(expr) if hint is None else hint
        if isinstance(value, bool):
            self._record(expr if value else sympy.Not(expr), origin)
        else:
            self._record(sympy.Eq(expr, value), origin)
        # the guard just recorded answers this question from now on, however often it comes
        self._decided[self.simplify(expr)] = value
        return value

    # -- guards ----------------------------------------------------------------------------

    @property
    def guards(self) -> list[ShapeGuard]:
        """Every relation recorded, in order, each once, then the ranges of the symbols that
        stayed free (``2 <= s0``: a size 1 there would break what was assumed of ``s0``)."""
        return [*self._guards.values(), *self._range_guards()]

    @property
    def recorded(self) -> list[ShapeGuard]:
        """The guards decisions and specializations added, without the symbols' ranges."""
        return list(self._guards.values())

    @property
    def relations(self) -> list[sympy.Basic]:
        """The guards' relations alone (sympy booleans over the env's symbols)."""
        return [g.expr for g in self.guards]

    def _range_guards(self) -> list[ShapeGuard]:
        # a bound a recorded guard tightened is implied by that guard
        out = []
        for s, info in self.symbols.items():
            value = self.replacements.get(s)
            if value is not None and (value.is_Integer or value.is_Symbol):
                continue  # its equality guard and the other symbol's range cover it
            declared, now = info.declared, info.range
            if declared.lower > -INF and now.lower == declared.lower:
                out.append(ShapeGuard(sympy.Ge(s, int(declared.lower))))
            if declared.upper < INF and now.upper == declared.upper:
                out.append(ShapeGuard(sympy.Le(s, int(declared.upper))))
        return out

    def _record(self, relation: sympy.Basic, origin: str) -> None:
        ranges = self._ranges()
        relation = reduce_by_ranges(self.simplify(relation), ranges)
        relation = _canonical(simplify_relation(relation, ranges))
        if relation is sympy.true or relation in self._guards:
            return
        if relation is sympy.false:
            msg = f"a guard that can never hold was recorded ({origin or 'no origin'})"
            raise AssertionError(msg)
        self._guards[relation] = ShapeGuard(relation, origin)
        self._refine(relation)
        self._static.clear()

    def _refine(self, relation: sympy.Basic) -> None:
        """Learn from a relation just assumed: equalities become replacements, bounds on one
        symbol narrow its range."""
        if not isinstance(relation, sympy.core.relational.Relational):
            return
        lhs, rhs = relation.lhs, relation.rhs
        if isinstance(relation, sympy.Eq):
            self._unify(lhs, rhs)
            return
        if not (isinstance(lhs, sympy.Symbol) and rhs.is_Integer):
            return
        if lhs not in self.symbols and lhs not in self.unbacked:
            return
        bound = int(rhs)
        new = {
            sympy.StrictLessThan: Range(-INF, bound - 1),
            sympy.LessThan: Range(-INF, bound),
            sympy.StrictGreaterThan: Range(bound + 1, INF),
            sympy.GreaterThan: Range(bound, INF),
        }.get(type(relation))
        if new is None:
            return
        if lhs in self.unbacked:
            self.unbacked[lhs] = self.unbacked[lhs] & new
        else:
            self.symbols[lhs].range = self.symbols[lhs].range & new

    def _unify(self, lhs: sympy.Expr, rhs: sympy.Expr) -> None:
        # replace the newest lone symbol of the two sides by the other side
        candidates = [
            (side, other)
            for side, other in ((lhs, rhs), (rhs, lhs))
            if isinstance(side, sympy.Symbol)
            and side in self.symbols
            and side not in other.free_symbols
            and other.is_integer
        ]
        if not candidates:
            return
        target, value = max(candidates, key=lambda c: _index(c[0]))
        if isinstance(value, sympy.Symbol) and value in self.symbols:
            # the symbol kept carries both ranges, and both are guarded on it
            kept, gone = self.symbols[value], self.symbols[target]
            kept.range = kept.range & gone.range
            kept.declared = kept.declared & gone.declared
        self.replacements = {k: v.xreplace({target: value}) for k, v in self.replacements.items()}
        self.replacements[target] = value
        self._simplified.clear()

    def _ranges(self) -> dict[sympy.Symbol, Range]:
        ranges = {s: info.range for s, info in self.symbols.items()}
        ranges.update(self.unbacked)
        return ranges

    def size_oblivious_value(self, expr: sympy.Basic) -> Scalar | None:
        """``static_value`` with every unbacked size assumed at least 2, as torch's
        size-oblivious questions are answered (a general kernel is right for 0 and 1 too)."""
        known = self.static_value(expr)
        if known is not None or not self.size_like:
            return known
        saved = dict(self.unbacked)
        try:
            for s in self.size_like:
                self.unbacked[s] = saved[s] & Range(2, INF)
            return self._static_value(expr)
        finally:
            self.unbacked = saved
            self._static.clear()  # answers under the assumption are not facts


def number(value: int | float) -> sympy.Number:
    """``value`` as a sympy number: a float with the 17 digits that give it back exactly."""
    if isinstance(value, float):
        return sympy.Float(value, 17)
    return sympy.Integer(value)


def _index(symbol: sympy.Symbol) -> int:
    return int(symbol.name[1:])


def _canonical(relation: sympy.Basic) -> sympy.Basic:
    """One spelling per relation, so equal guards deduplicate (numbers on the right,
    ``a > b`` as ``b < a`` where sympy orders it so)."""
    if isinstance(relation, sympy.core.relational.Relational):
        return relation.canonical
    return relation


def _to_python(value: sympy.Basic) -> Scalar:
    if value is sympy.true or value is sympy.false:
        return bool(value)
    if value.is_Integer:
        return int(value)
    if value.is_Number:
        return float(value)
    msg = f"{value} has no value without its symbols' values"
    raise ValueError(msg)
