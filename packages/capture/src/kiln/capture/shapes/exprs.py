"""Sympy pieces of shape expressions: integer functions and value ranges.

Sizes are sympy expressions over symbols that stand for input sizes. Python's ``//`` and
``%`` on ints are not sympy's ``floor(a / b)`` and ``Mod`` in every form sympy rewrites
them into, so they are functions of their own here (printed back as ``//`` and ``%``).
``bounds`` answers the interval an expression lies in from its symbols' ranges (every
unspecialized size is at least 2), which decides many comparisons without a guard.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import sympy

__all__ = [
    "FloorDiv",
    "Mod",
    "Trunc",
    "Range",
    "bounds",
    "tight_bounds",
    "decide",
    "decide_range",
    "sample_values",
    "simplify_relation",
    "reduce_by_ranges",
    "INF",
]

INF = math.inf


class FloorDiv(sympy.Function):
    """Python's ``a // b`` on integers."""

    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:  # type: ignore[override]
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer and b != 0:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv):
            return FloorDiv(a.args[0], a.args[1] * b)
        ratio = a / b
        # a constant ratio (``576*x // (64*x)``) divides exactly whatever x is
        if ratio.is_Integer or (b.is_positive and ratio.is_integer):
            return ratio
        return None


class Mod(sympy.Function):
    """Python's ``a % b`` on integers (the sign of ``b``)."""

    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:  # type: ignore[override]
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer and b != 0:
            return sympy.Integer(int(a) % int(b))
        if (a / b).is_integer:
            return sympy.Integer(0)
        return None


class Trunc(sympy.Function):
    """Python's ``int(x)`` on a float: rounds toward zero."""

    nargs = (1,)
    is_integer = True

    @classmethod
    def eval(cls, x: sympy.Expr) -> sympy.Expr | None:  # type: ignore[override]
        if x.is_integer:
            return x
        if x.is_Number:
            return sympy.Integer(int(x))
        return None


@dataclasses.dataclass(frozen=True)
class Range:
    """A closed interval ``[lower, upper]`` of reals (``-INF``/``INF`` for unbounded)."""

    lower: float
    upper: float

    @staticmethod
    def point(value: float) -> Range:
        return Range(value, value)

    def __add__(self, other: Range) -> Range:
        return Range(self.lower + other.lower, self.upper + other.upper)

    def __mul__(self, other: Range) -> Range:
        products = [
            _mul(a, b) for a in (self.lower, self.upper) for b in (other.lower, other.upper)
        ]
        return Range(min(products), max(products))

    def __and__(self, other: Range) -> Range:
        return Range(max(self.lower, other.lower), min(self.upper, other.upper))


_UNKNOWN = Range(-INF, INF)


def _mul(a: float, b: float) -> float:
    # 0 * inf is 0 here: a factor known to be zero makes the product zero
    return 0.0 if a == 0 or b == 0 else a * b


def _floordiv(a: Range, b: Range) -> Range:
    """``a // b`` for a positive ``b``. The quotient grows with ``a``: it is least at ``a``'s
    lower end over the largest ``b`` (the smallest, where that end is negative), and most at
    the upper end over the smallest ``b`` (the largest, where that end is negative). Either
    end may be infinite (a size ``(s - 5) // 2 + 1`` of a symbol with no lower bound)."""
    if b.lower <= 0:
        return _UNKNOWN
    low = a.lower / (b.upper if a.lower >= 0 else b.lower)
    high = a.upper / (b.lower if a.upper >= 0 else b.upper)
    return Range(_floor(low, -INF), _floor(high, INF))


def _floor(value: float, unknown: float) -> float:
    """``floor(value)``, infinities kept; ``unknown`` for an undefined ``inf / inf``."""
    if math.isnan(value):
        return unknown
    return value if math.isinf(value) else math.floor(value)


def bounds(expr: sympy.Basic, ranges: Mapping[sympy.Symbol, Range]) -> Range:
    """The interval ``expr`` lies in when each symbol lies in its range (unknown: unbounded)."""
    if expr.is_Number:
        return Range.point(float(expr))
    if isinstance(expr, sympy.Symbol):
        return ranges.get(expr, _UNKNOWN)
    args = [bounds(a, ranges) for a in expr.args]
    if isinstance(expr, sympy.Add):
        total = args[0]
        for r in args[1:]:
            total = total + r
        return total
    if isinstance(expr, sympy.Mul):
        product = args[0]
        for r in args[1:]:
            product = product * r
        return product
    if isinstance(expr, FloorDiv):
        return _floordiv(args[0], args[1])
    if isinstance(expr, Mod):
        if args[1].lower > 0:
            below = Range(0, args[1].upper - 1)
            # a % b is at most a only for a >= 0: -1 % 8 is 7
            return below & Range(0, args[0].upper) if args[0].lower >= 0 else below
        return _UNKNOWN
    if isinstance(expr, sympy.Max):
        return Range(max(r.lower for r in args), max(r.upper for r in args))
    if isinstance(expr, sympy.Min):
        return Range(min(r.lower for r in args), min(r.upper for r in args))
    if isinstance(expr, sympy.Pow) and expr.args[1].is_Integer:
        base, n = args[0], int(expr.args[1])
        if n > 0 and base.lower >= 0:
            return Range(base.lower**n, base.upper**n)
        if n < 0 and base.lower > 0:
            return Range(base.upper**n, base.lower**n)
    return _UNKNOWN


_MAX_OPS = 40
# How far above its lowest value a symbol is sampled (odd, so it meets no power of two).
_FAR = 1009


def decide_range(relation: sympy.Basic, diff: Range) -> bool | None:
    """The value of ``lhs <op> rhs`` for every ``lhs - rhs`` in ``diff``, or None."""
    lo, hi = diff.lower, diff.upper
    answers: dict[type, tuple[bool, bool]] = {
        # relation kind: (known True when, known False when)
        sympy.Eq: (lo == hi == 0, lo > 0 or hi < 0),
        sympy.Ne: (lo > 0 or hi < 0, lo == hi == 0),
        sympy.StrictLessThan: (hi < 0, lo >= 0),
        sympy.LessThan: (hi <= 0, lo > 0),
        sympy.StrictGreaterThan: (lo > 0, hi <= 0),
        sympy.GreaterThan: (lo >= 0, hi < 0),
    }
    true, false = answers.get(type(relation), (False, False))
    return True if true else False if false else None


def decide(relation: sympy.Basic, ranges: Mapping[sympy.Symbol, Range]) -> bool | None:
    """The value of the relation ``lhs <op> rhs`` for every value its symbols' ranges admit,
    or None when the ranges do not settle it.

    Interval bounds first, then :func:`tight_bounds`, which is costly (expanding, factoring,
    collecting); a relation that holds at one point of the ranges and fails at another can be
    settled by no bound, so a few sampled points that disagree answer None without it.
    """
    diff = relation.lhs - relation.rhs
    quick = decide_range(relation, bounds(diff, ranges))
    if quick is not None:
        return quick
    seen = {decide_range(relation, Range.point(v)) for v in sample_values(diff, ranges)}
    if True in seen and False in seen:
        return None
    return decide_range(relation, tight_bounds(diff, ranges))


def sample_values(expr: sympy.Basic, ranges: Mapping[sympy.Symbol, Range]) -> list[int]:
    """Values of ``expr`` at a few points its symbols' ranges admit (each symbol at its lowest
    value, one above it, far above it), where they are exact integers (a point with a division
    by zero, a fraction or a float is left out).

    A sample is a witness, never a proof: it can show that a bound cannot settle a question
    (the question has both answers within the ranges), so the costly search for a bound
    that would is skipped; every answer given is still one the ranges prove."""
    symbols = [s for s in expr.free_symbols if isinstance(s, sympy.Symbol)]
    if not symbols or len(symbols) != len(expr.free_symbols):
        return []
    picks = {s: _picks(ranges.get(s, _UNKNOWN)) for s in symbols}
    if any(not p for p in picks.values()):
        return []
    out = []
    for i in range(3):
        value = expr.xreplace({s: sympy.Integer(p[min(i, len(p) - 1)]) for s, p in picks.items()})
        if value.is_Integer:
            out.append(int(value))
    return out


def _picks(r: Range) -> list[int]:
    """Three integers in ``r`` (none if it holds none): its lowest one, one above, one far
    above (its highest, one below, far below when it has no lower end)."""
    if r.lower > -INF:
        start, step = math.ceil(r.lower), 1
    elif r.upper < INF:
        start, step = math.floor(r.upper), -1
    else:
        start, step = 0, 1
    if not r.lower <= start <= r.upper:
        return []
    # clipped into the range: a bounded size is sampled at its upper end instead
    return [int(min(max(start + step * k, r.lower), r.upper)) for k in (0, 1, _FAR)]


def tight_bounds(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, Range]) -> Range:
    """``bounds`` of ``expr`` over several equal forms of it, intersected.

    An interval of a sum forgets that its terms share symbols (``s0*s2 - s2`` could be
    negative term by term), so the sum is also bounded factored (``s2*(s0 - 1)``) and
    collected on each symbol; ``a // b`` is also bounded as ``a/b - r`` with ``0 <= r < 1``,
    which relates it to ``a`` elsewhere in the expression.
    """
    if expr.is_Symbol or expr.is_Number or sympy.count_ops(expr) > _MAX_OPS:
        # past a size, expanding and collecting costs more than the guard it could save
        return bounds(expr, ranges)
    # kernels ask about the same few expressions over and over, under unchanged ranges
    used = frozenset((s, ranges[s]) for s in expr.free_symbols if s in ranges)
    return _tight_bounds(expr, used)


@functools.lru_cache(maxsize=4096)
def _tight_bounds(expr: sympy.Expr, used: frozenset[tuple[sympy.Symbol, Range]]) -> Range:
    ranges = dict(used)
    floors = {}
    for i, f in enumerate(expr.atoms(FloorDiv)):
        a, b = f.args
        if bounds(b, ranges).lower > 0:
            r = sympy.Dummy(f"r{i}")
            ranges[r] = Range(0, 1)
            floors[f] = a / b - r
    forms = [expr, expr.xreplace(floors)] if floors else [expr]
    result = Range(-INF, INF)
    for form in forms:
        result = result & bounds(form, ranges) & _grouped(form, ranges, depth=3)
    return result


def _grouped(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, Range], depth: int) -> Range:
    """Bounds of a sum factored (``s2*(s0*s1*s2 - 1)``) and collected on each of its symbols
    in turn, the parts likewise: ``s1*s0*s2 - s1*s2 + 4*s1*r`` as ``s1*(s2*(s0 - 1) + 4*r)``."""
    expr = sympy.expand(expr)
    best = bounds(expr, ranges)
    if depth == 0 or not isinstance(expr, sympy.Add):
        return best
    factored = sympy.factor_terms(expr)
    if isinstance(factored, sympy.Mul):
        product = Range.point(1)
        for factor in factored.args:
            product = product * _grouped(factor, ranges, depth - 1)
        best = best & product
    for s in expr.free_symbols & ranges.keys():
        total = Range.point(0)
        for key, coeff in sympy.collect(expr, s, evaluate=False).items():
            total = total + bounds(key, ranges) * _grouped(coeff, ranges, depth - 1)
        best = best & total
    return best


def simplify_relation(relation: sympy.Basic, ranges: Mapping[sympy.Symbol, Range]) -> sympy.Basic:
    """An equality or disequality with the positive factors both sides share cancelled and
    ``a - b*(a // b)`` written as ``a % b``: ``s0*s2 == 4*s0*(s2 // 4)`` is ``s2 % 4 == 0``."""
    if not isinstance(relation, (sympy.Eq, sympy.Ne)) or relation.has(sympy.Float):
        return relation
    diff = sympy.expand(relation.lhs - relation.rhs)
    floors = {f: (f.args[0] - Mod(*f.args)) / f.args[1] for f in diff.atoms(FloorDiv)}
    if floors:
        rewritten = sympy.expand(diff.xreplace(floors))
        if rewritten.count_ops() < diff.count_ops():
            diff = rewritten
    factored = sympy.factor_terms(diff)
    if isinstance(factored, sympy.Mul):
        kept = [f for f in factored.args if not bounds(f, ranges).lower > 0]
        if len(kept) < len(factored.args):
            diff = sympy.Mul(*kept)
    if diff == sympy.expand(relation.lhs - relation.rhs):
        return relation
    constant = diff.as_coeff_Add()[0]
    return type(relation)(diff - constant, -constant)


def reduce_by_ranges(expr: sympy.Basic, ranges: Mapping[sympy.Symbol, Range]) -> sympy.Basic:
    """``a % b`` as ``a`` and ``a // b`` as 0 where ``0 <= a < b`` for every value in range
    (``s0 % (s0*s1)`` is ``s0``, ``1 % s2`` is 1: every symbol is at least 2), and
    ``max(a, b)``/``min(a, b)`` as the side that is always the larger/smaller one."""

    def smaller(a: sympy.Expr, b: sympy.Expr) -> bool:
        return bounds(a, ranges).lower >= 0 and nonnegative(b - a, strict=True)

    def nonnegative(expr: sympy.Expr, strict: bool = False) -> bool:
        """``expr >= 0`` (``> 0`` if ``strict``) for every value in range."""
        if _above(bounds(expr, ranges).lower, strict):
            return True
        if any(not _above(v, strict) for v in sample_values(expr, ranges)):
            return False  # a value below occurs: no bound can prove it
        return _above(tight_bounds(expr, ranges).lower, strict)

    replacements: dict[sympy.Basic, sympy.Basic] = {}
    for m in expr.atoms(Mod):
        if smaller(*m.args):
            replacements[m] = m.args[0]
    for f in expr.atoms(FloorDiv):
        if smaller(*f.args):
            replacements[f] = sympy.Integer(0)
    for m in expr.atoms(sympy.Max, sympy.Min):
        if len(m.args) == 2:
            a, b = m.args
            low = nonnegative(a - b)  # a >= b always
            high = nonnegative(b - a)  # b >= a always
            if low or high:
                replacements[m] = a if low == isinstance(m, sympy.Max) else b
    return expr.xreplace(replacements) if replacements else expr


def _above(value: float, strict: bool) -> bool:
    return value > 0 if strict else value >= 0
