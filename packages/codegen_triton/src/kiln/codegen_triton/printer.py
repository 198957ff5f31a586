"""Sympy index expressions printed as Triton code, after simplification.

loopir hands over storage positions built from ``+``, ``*``, ``FloorDiv`` and
``ModularIndexing`` of the flat ``xindex``/``rindex``. Before printing we fold
digit pairs back together (``8*(x // 8) + x % 8`` is ``x``) and drop divisions
the index ranges make trivial, so a contiguous load prints as ``ptr + xindex``
and Triton sees a unit-stride access it can vectorise.
"""

from __future__ import annotations

import sympy

from kiln.codegen_triton.errors import TritonCodegenError
from kiln.loopir import sizes

__all__ = ["simplify_index", "print_index", "index_bounds"]

FloorDiv = sizes.FloorDiv
ModularIndexing = sizes.ModularIndexing


def _terms(expr: sympy.Expr) -> list[tuple[sympy.Expr, sympy.Expr]]:
    """``expr`` as (coefficient, atom) pairs."""
    out = []
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        out.append((sympy.Integer(coeff) if coeff.is_Integer else coeff, rest))
    return out


def _merge_once(terms: list[tuple[sympy.Expr, sympy.Expr]]) -> bool:
    """Fold one pair ``c*m*F(a, d*m) + c*M(a, d, m)`` into ``c*F(a, d)`` (or
    ``c*m*M(a, d*m, n) + c*M(a, d, m)`` into ``c*M(a, d, m*n)``); True if done."""
    for i, (ci, ai) in enumerate(terms):
        if not isinstance(ai, ModularIndexing):
            continue
        base, div, mod = ai.args
        for j, (cj, aj) in enumerate(terms):
            if j == i or cj != ci * mod:
                continue
            wider = _wider_digit(aj, base, div * mod)
            if wider is None:
                continue
            merged = (
                FloorDiv(base, div) if not wider else ModularIndexing(base, div, mod * wider[0])
            )
            terms[i] = (ci, merged)
            del terms[j]
            return True
    return False


def _wider_digit(
    atom: sympy.Expr, base: sympy.Expr, span: sympy.Expr
) -> tuple[()] | tuple[sympy.Expr] | None:
    """``()`` when ``atom`` is ``base // span``; ``(m,)`` when it is ``(base // span) % m``."""
    if isinstance(atom, FloorDiv) and atom.args[0] == base and atom.args[1] == span:
        return ()
    if isinstance(atom, ModularIndexing) and atom.args[0] == base and atom.args[1] == span:
        return (atom.args[2],)
    if span == 1 and atom == base:
        return ()
    return None


def _drop_low_part(
    base: sympy.Expr, div: sympy.Expr, ranges: dict[sympy.Symbol, int]
) -> tuple[sympy.Expr, sympy.Expr] | None:
    """``(k*A + b, k*d)`` as ``(A, d)`` when ``0 <= b < k``: the low part never reaches the digit."""
    d = sizes.static_int(div)
    if d is None or not isinstance(base, sympy.Add):
        return None
    for k in sorted({int(c) for c, _ in _terms(base) if c.is_Integer and int(c) > 1}, reverse=True):
        if d % k:
            continue
        high = [c * a for c, a in _terms(base) if c.is_Integer and int(c) % k == 0]
        low = sympy.Add(*[c * a for c, a in _terms(base) if not (c.is_Integer and int(c) % k == 0)])
        bound = sizes.bounds(low, ranges)
        if high and bound is not None and bound[0] >= 0 and bound[1] < k:
            return sympy.expand(sympy.Add(*high) / k), sympy.Integer(d // k)
    return None


def _split_digits(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Apply :func:`_drop_low_part` to every ``FloorDiv``/``ModularIndexing`` in ``expr``."""
    if not expr.args or expr.is_Atom:
        return expr
    expr = expr.func(*[_split_digits(a, ranges) for a in expr.args])
    if isinstance(expr, (FloorDiv, ModularIndexing)):
        found = _drop_low_part(expr.args[0], expr.args[1], ranges)
        if found is not None:
            base, div = found
            return (
                FloorDiv(base, div)
                if isinstance(expr, FloorDiv)
                else ModularIndexing(base, div, expr.args[2])
            )
    return expr


def simplify_index(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Fold digit pairs and drop divisions made trivial by ``ranges`` (symbol → size)."""
    expr = sizes.simplify_with_ranges(sympy.expand(expr), ranges)
    expr = sizes.simplify_with_ranges(_split_digits(expr, ranges), ranges)
    terms = _terms(expr)
    changed = False
    while _merge_once(terms):
        changed = True
    if changed:
        expr = sympy.Add(*[c * a for c, a in terms])
        expr = sizes.simplify_with_ranges(expr, ranges)
    return expr


def index_bounds(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> int | None:
    """The largest value ``expr`` takes when every symbol's range is known, else None."""
    bound = sizes.bounds(expr, ranges)
    return bound[1] if bound is not None else None


def print_index(expr: sympy.Expr) -> str:
    """Triton source for an index expression (operands are non-negative)."""
    if expr.is_Integer:
        return str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return expr.name
    if isinstance(expr, sympy.Add):
        parts = [print_index(a) for a in _ordered(expr.args)]
        text = parts[0]
        for part in parts[1:]:
            text += f" - {part[1:]}" if part.startswith("-") else f" + {part}"
        return text
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        factors = [_paren(a) for a in sympy.Mul.make_args(rest)]
        if coeff == -1:
            return "-" + "*".join(factors)
        return "*".join([str(int(coeff))] * (coeff != 1) + factors)
    if isinstance(expr, FloorDiv):
        return f"({_paren(expr.args[0])} // {_paren(expr.args[1])})"
    if isinstance(expr, ModularIndexing):
        base, div, mod = expr.args
        inner = _paren(base) if div == 1 else f"({_paren(base)} // {_paren(div)})"
        return f"({inner} % {_paren(mod)})"
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return "*".join([_paren(expr.base)] * int(expr.exp))
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = "maximum" if isinstance(expr, sympy.Max) else "minimum"
        args = [print_index(a) for a in expr.args]
        text = args[0]
        for arg in args[1:]:
            text = f"tl.{fn}({text}, {arg})"
        return text
    msg = f"cannot print index expression {expr} ({type(expr).__name__}) as Triton code"
    raise TritonCodegenError(msg)


def _paren(expr: sympy.Expr) -> str:
    text = print_index(expr)
    return f"({text})" if isinstance(expr, sympy.Add) else text


def _ordered(args: tuple[sympy.Expr, ...]) -> list[sympy.Expr]:
    """Constants last, otherwise sympy's order: stable output for golden files."""
    return sorted(args, key=lambda a: (a.is_Integer, sympy.default_sort_key(a)))
