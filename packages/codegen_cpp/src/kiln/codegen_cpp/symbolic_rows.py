"""Rows of a symbolic length: the 2-D loop nest of a pointwise kernel whose sizes are symbols.

A static kernel over an NCHW tensor loops over rows of one plane (or one image row) with a
vectorized loop over its columns, so a channel's parameters are read once per row and a
strided window (a max pool's) is a vector gather. With symbolic sizes the flat ``xindex``
cannot be split by arithmetic on numbers: each digit ``xindex // (H*W) % C`` stays a
per-lane division, and every load becomes a gather. Here the period is a symbolic size
``c`` that divides the kernel's element count and every digit's divisor (or is divided by
it); ``xindex`` is ``c*xrow + xcol`` with ``0 <= xcol < c``, and each digit of ``xindex``
is rewritten in terms of ``xrow`` or ``xcol`` by divisibility alone, which needs no range
of any size symbol. A digit the rules do not cover keeps ``c*xrow + xcol`` as its base,
which is still exact.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import sympy

from kiln.loopir.kernel import XINDEX
from kiln.loopir.sizes import FloorDiv, ModularIndexing, merge_digits

__all__ = ["quotient", "same_size", "split_index", "symbolic_periods"]


@functools.lru_cache(maxsize=4096)
def quotient(numerator: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
    """``numerator / divisor`` when it is a polynomial with integer coefficients (so the
    division is exact for every value of the symbols), else None. Cached: a kernel asks
    about the same few sizes for every load, and ``cancel`` is slow."""
    if divisor == 0:
        return None
    if same_size(numerator, divisor):
        return sympy.S.One
    q = sympy.cancel(sympy.expand(numerator) / sympy.expand(divisor))
    num, den = sympy.fraction(q)
    if den != 1:
        return None
    q = sympy.expand(num)
    coeffs = (t.as_coeff_Mul()[0] for t in sympy.Add.make_args(q))
    return q if all(c.is_Integer for c in coeffs) else None


def symbolic_periods(numel: sympy.Expr, indices: Iterable[sympy.Expr]) -> list[sympy.Expr]:
    """Row lengths to try for a kernel of ``numel`` elements whose loads use ``indices``:
    the symbolic divisors (and moduli of low digits) of ``xindex`` that divide ``numel``,
    the longest first (a period before the periods it is a multiple of)."""
    candidates: list[sympy.Expr] = []
    for index in indices:
        for digit in sympy.sympify(index).atoms(FloorDiv, ModularIndexing):
            if digit.args[0] != XINDEX:
                continue
            found = digit.args[1]
            if isinstance(digit, ModularIndexing) and found == 1:
                found = digit.args[2]
            if not found.is_number and all(not same_size(found, c) for c in candidates):
                candidates.append(found)
    dividing = [c for c in candidates if quotient(numel, c) is not None]
    multiples = {
        i: sum(quotient(o, c) is not None for o in dividing) for i, c in enumerate(dividing)
    }
    return [dividing[i] for i in sorted(multiples, key=lambda i: multiples[i])]


def same_size(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.expand(a - b) == 0


@functools.lru_cache(maxsize=16384)
def split_index(
    index: sympy.Expr,
    period: sympy.Expr,
    row: sympy.Symbol,
    col: sympy.Symbol,
    numel: sympy.Expr | None = None,
) -> sympy.Expr:
    """``index`` with ``xindex = period*row + col`` (``0 <= col < period``). A kernel runs
    only when ``numel`` (a product of sizes) is positive, so each of its factors is at
    least one: a stride ``Max(1, size)`` of such a size is the size."""
    index = sympy.sympify(index)
    if numel is not None and index.has(sympy.Max):
        dims = [f for f in sympy.Mul.make_args(numel) if not f.is_number]
        index = index.replace(
            lambda e: isinstance(e, sympy.Max) and len(e.args) == 2 and 1 in e.args,
            lambda e: _at_least_one(e, dims),
        )
    rewritten: dict[sympy.Expr, sympy.Expr] = {}
    for digit in sympy.sympify(index).atoms(FloorDiv, ModularIndexing):
        if digit.args[0] == XINDEX:
            found = _split_digit(digit, period, row, col)
            if found is not None:
                rewritten[digit] = found
    out = sympy.sympify(index).xreplace(rewritten) if rewritten else sympy.sympify(index)
    out = out.xreplace({XINDEX: period * row + col})
    return merge_digits(_collect_digits(sympy.expand(out), {row, col}))


def _at_least_one(e: sympy.Expr, dims: list[sympy.Expr]) -> sympy.Expr:
    size = e.args[1] if e.args[0] == 1 else e.args[0]
    return size if any(same_size(size, d) for d in dims) else e


def _collect_digits(expr: sympy.Expr, loop_vars: set[sympy.Symbol]) -> sympy.Expr:
    """An expanded sum with the terms of each digit of a loop variable gathered,
    ``(w - 1)*d + d`` as ``((w - 1) + 1)*d``, so :func:`merge_digits` sees one term per
    digit (a size ``w`` may itself hold a ``FloorDiv`` of a size symbol)."""
    if not isinstance(expr, sympy.Add):
        return expr
    coeffs: dict[sympy.Expr, list[sympy.Expr]] = {}
    rest: list[sympy.Expr] = []
    for term in expr.args:
        digits = [
            f
            for f in sympy.Mul.make_args(term)
            if isinstance(f, (FloorDiv, ModularIndexing)) and f.args[0].free_symbols & loop_vars
        ]
        if len(digits) != 1:
            rest.append(term)
            continue
        coeff = sympy.Mul(*[f for f in sympy.Mul.make_args(term) if f is not digits[0]])
        coeffs.setdefault(digits[0], []).append(coeff)
    gathered = [sympy.Mul(sympy.Add(*c), d, evaluate=False) for d, c in coeffs.items()]
    return sympy.Add(*rest, *gathered)


def _split_digit(
    digit: sympy.Expr, c: sympy.Expr, row: sympy.Symbol, col: sympy.Symbol
) -> sympy.Expr | None:
    d = digit.args[1]
    if isinstance(digit, FloorDiv):
        q = quotient(d, c)  # d = c*q: (c*row + col) // d is row // q
        if q is not None:
            return FloorDiv(row, q)
        p = quotient(c, d)  # c = d*p: p*row + col // d
        return None if p is None else p * row + FloorDiv(col, d)
    m = digit.args[2]
    q = quotient(d, c)
    if q is not None:
        return ModularIndexing(row, q, m)
    p = quotient(c, d)
    if p is None:
        return None
    # (p*row + col // d) % m, with col // d < p
    if quotient(p, m) is not None:  # p a multiple of m: the row part vanishes
        # and where p is m, col // d < m needs no remainder
        return FloorDiv(col, d) if same_size(p, m) else ModularIndexing(col, d, m)
    t = quotient(m, p)  # m = p*t: p * (row % t) + col // d
    if t is not None:
        return p * ModularIndexing(row, 1, t) + FloorDiv(col, d)
    return None
