"""Sympy helpers for sizes, strides and index expressions.

Every size, stride and index in loopir is a sympy expression from day one so that
dynamic shapes only add free symbols. This module holds the integer functions
index expressions use (``FloorDiv``, ``ModularIndexing``), the constructors of
index symbols, and the simplifications the IR relies on.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Iterable, Sequence

import sympy

from kiln.loopir import symbolic
from kiln.loopir.errors import StaticShapesOnly

__all__ = [
    "Expr",
    "FloorDiv",
    "ModularIndexing",
    "sympify",
    "index_symbol",
    "is_index_symbol",
    "product",
    "contiguous_strides",
    "flat_index",
    "unflatten_index",
    "reshape_index",
    "affine_strides",
    "static_int",
    "evaluate_int",
    "linear_index",
    "simplify_with_ranges",
    "merge_digits",
    "same",
    "bounds",
]

Expr = sympy.Expr


class FloorDiv(sympy.Function):
    """``floor(base / divisor)`` on non-negative integers (codegens print ``//``)."""

    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:  # type: ignore[override]
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        if isinstance(base, ModularIndexing) and divisor.is_Integer:
            # a digit's high part: (e // s % M) // d is e // (s*d) % (M/d) when d divides M
            inner, step, span = base.args
            if span.is_Integer and int(span) % int(divisor) == 0:
                return ModularIndexing(inner, step * divisor, span / divisor)
        if isinstance(base, sympy.Add):
            # (a*d + b) // d == a + b // d when every term but b is a multiple of d
            whole = [t for t in base.args if (t / divisor).is_integer]
            if whole:
                rest = sympy.Add(*[t for t in base.args if t not in whole])
                return sympy.Add(*[t / divisor for t in whole]) + FloorDiv(rest, divisor)
        if (base / divisor).is_integer:
            return base / divisor
        return None


class ModularIndexing(sympy.Function):
    """``(base // divisor) % modulus`` on non-negative integers: one digit of a flat index."""

    nargs = (3,)
    is_integer = True

    @classmethod
    def eval(  # type: ignore[override]
        cls, base: sympy.Expr, divisor: sympy.Expr, modulus: sympy.Expr
    ) -> sympy.Expr | None:
        if base == 0 or modulus == 1:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer and modulus.is_Integer:
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        if isinstance(base, FloorDiv):
            # (e // a) // d % m is e // (a*d) % m: one form for a digit, so digits merge
            return ModularIndexing(base.args[0], base.args[1] * divisor, modulus)
        if isinstance(base, ModularIndexing) and (divisor * modulus).is_Integer:
            # a digit of a digit: (e // d % M) // a % m is e // (d*a) % m when a*m divides M
            inner, step, span = base.args
            if span.is_Integer and int(span) % int(divisor * modulus) == 0:
                return ModularIndexing(inner, step * divisor, modulus)
        if isinstance(base, sympy.Add):
            # drop terms that are multiples of divisor*modulus: they never change the digit
            span = divisor * modulus
            kept = [t for t in base.args if not (t / span).is_integer]
            if len(kept) != len(base.args):
                return ModularIndexing(sympy.Add(*kept), divisor, modulus)
        return None


def sympify(value: int | sympy.Expr | object) -> sympy.Expr:
    """An integer-valued sympy expression from an int, SymInt-like or expression."""
    if isinstance(value, sympy.Expr):
        return value
    if isinstance(value, bool):
        return sympy.Integer(int(value))
    if isinstance(value, int):
        return sympy.Integer(value)
    node = getattr(value, "node", None)
    expr = getattr(node, "expr", None)
    if isinstance(expr, sympy.Expr):
        return expr if expr.is_Atom else symbolic.from_capture(expr)
    return sympy.Integer(int(value))  # type: ignore[call-overload, arg-type]


@functools.cache
def index_symbol(prefix: str, n: int) -> sympy.Symbol:
    """The ``n``-th index variable of a kind (``x0``, ``r1``, ``indirect2``...)."""
    return sympy.Symbol(f"{prefix}{n}", integer=True, nonnegative=True)


def is_index_symbol(sym: sympy.Basic, prefix: str) -> bool:
    """True when ``sym`` is an index symbol made by :func:`index_symbol` with ``prefix``."""
    return isinstance(sym, sympy.Symbol) and sym.name.startswith(prefix)


def product(values: Iterable[sympy.Expr | int]) -> sympy.Expr:
    """The product of sizes (1 for none)."""
    return sympy.Integer(1) * functools.reduce(operator.mul, values, sympy.Integer(1))


def contiguous_strides(sizes: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """Row-major strides of ``sizes`` (size-1 dims get the stride they would have)."""
    strides: list[sympy.Expr] = []
    acc: sympy.Expr = sympy.Integer(1)
    for size in reversed(sizes):
        strides.append(acc)
        acc = acc * _at_least_one(size) if not size.is_Integer else acc * max(int(size), 1)
    return list(reversed(strides))


def _at_least_one(size: sympy.Expr) -> sympy.Expr:
    """``Max(size, 1)``, or ``size`` where the guards keep it at least 1 (a convolution's
    output height ``(s2 - 1) // 2 + 1``): a ``Max`` in a stride hides from the kernels that
    a dim's rows are contiguous."""
    return size if symbolic.lower_bound(size) >= 1 else _max_one(size)


@functools.lru_cache(maxsize=4096)
def _max_one(size: sympy.Expr) -> sympy.Expr:
    """``Max(size, 1)``, remembered: sympy compares a ``Max``'s arguments as it builds one,
    slowly for symbolic sizes, and layouts ask for the strides of the same sizes often."""
    return sympy.Max(size, 1)


def linear_index(
    index: Sequence[sympy.Expr], strides: Sequence[sympy.Expr], offset: sympy.Expr = sympy.S.Zero
) -> sympy.Expr:
    """``offset + sum(index[i] * strides[i])``: the storage position of an element."""
    return offset + sympy.Add(*[i * s for i, s in zip(index, strides, strict=True)])


def flat_index(index: Sequence[sympy.Expr], sizes: Sequence[sympy.Expr]) -> sympy.Expr:
    """The row-major flat position of a multi-dimensional index."""
    return linear_index(index, contiguous_strides(sizes))


def unflatten_index(flat: sympy.Expr, sizes: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """Split a row-major flat index into one index per dimension."""
    return list(_unflatten(flat, tuple(sizes)))


def reshape_index(
    index: Sequence[sympy.Expr], new: Sequence[sympy.Expr], old: Sequence[sympy.Expr]
) -> list[sympy.Expr]:
    """The index into shape ``old`` of the element at ``index`` of its reshape to ``new``.

    Dims are split into runs whose sizes multiply to the same product on both sides, and
    each run is flattened and split on its own: the dims a reshape leaves alone keep their
    index, so a shifted index (a ``cat`` piece's ``c - 512``) is not pushed through floor
    divisions and modulos of the whole flat position, which do not simplify.
    """
    runs = _reshape_runs(tuple(old), tuple(new))
    if runs is None:
        return unflatten_index(flat_index(index, new), old)
    out: list[sympy.Expr] = []
    for (o0, o1), (n0, n1) in runs:
        out += unflatten_index(flat_index(index[n0:n1], new[n0:n1]), old[o0:o1])
    return out


Run = tuple[tuple[int, int], tuple[int, int]]


@functools.lru_cache(maxsize=1024)
def _reshape_runs(old: tuple[sympy.Expr, ...], new: tuple[sympy.Expr, ...]) -> list[Run] | None:
    """Pairs of (old dims, new dims) ranges with equal products; None for symbolic or empty."""
    known = [static_int(s) for s in (*old, *new)]
    if any(v is None or v == 0 for v in known):
        return None
    olds, news = [int(v or 0) for v in known[: len(old)]], [int(v or 0) for v in known[len(old) :]]
    runs: list[Run] = []
    i = j = 0
    while i < len(olds) or j < len(news):
        i0, j0, po, pn = i, j, 1, 1
        if i < len(olds):
            po, i = olds[i], i + 1
        if j < len(news):
            pn, j = news[j], j + 1
        while po != pn:
            if po < pn and i < len(olds):
                po, i = po * olds[i], i + 1
            elif pn < po and j < len(news):
                pn, j = pn * news[j], j + 1
            else:
                return None
        runs.append(((i0, i), (j0, j)))
    return runs


@functools.lru_cache(maxsize=8192)
def _unflatten(flat: sympy.Expr, sizes: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...]:
    out: list[sympy.Expr] = []
    divisor: sympy.Expr = sympy.Integer(1)
    for i in reversed(range(len(sizes))):
        size = sizes[i]
        if size == 1:
            out.append(sympy.Integer(0))
            continue
        if i == 0:
            out.append(FloorDiv(flat, divisor))
        else:
            out.append(ModularIndexing(flat, divisor, size))
        divisor = divisor * size
    return tuple(reversed(out))


def affine_strides(
    expr: sympy.Expr, symbols: Sequence[sympy.Symbol]
) -> tuple[sympy.Expr, list[sympy.Expr]] | None:
    """``expr`` as ``offset + sum(stride * symbol)`` with ``offset`` and each stride free
    of ``symbols``, or None when ``expr`` is not affine in them."""
    expr = sympy.expand(expr)
    offset = expr.subs(dict.fromkeys(symbols, 0))
    strides = [expr.coeff(s) for s in symbols]
    if any(c.free_symbols & set(symbols) for c in strides) or offset.free_symbols & set(symbols):
        return None
    rebuilt = offset + sympy.Add(*[c * s for c, s in zip(strides, symbols, strict=True)])
    if sympy.expand(rebuilt - expr) != 0:
        return None
    return offset, strides


def static_int(expr: sympy.Expr | int) -> int | None:
    """The value of ``expr`` when it is a known integer, else None."""
    if isinstance(expr, int):
        return expr
    return int(expr) if expr.is_Integer else None


def evaluate_int(expr: sympy.Expr | int) -> int:
    """The integer value of a size with no free symbols (the static-shape path)."""
    value = static_int(sympy.sympify(expr))
    if value is None:
        msg = f"size {expr} is symbolic where loopir needs a number"
        raise StaticShapesOnly(msg)
    return value


def bounds(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> tuple[int, int] | None:
    """Integer bounds of an index expression when every symbol has a known range."""
    if expr.is_Integer:
        return int(expr), int(expr)
    if isinstance(expr, sympy.Symbol):
        size = ranges.get(expr)
        return (0, size - 1) if size is not None else None
    if isinstance(expr, sympy.Add):
        lo = hi = 0
        for arg in expr.args:
            b = bounds(arg, ranges)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return lo, hi
    if isinstance(expr, sympy.Mul):
        lo = hi = 1
        for arg in expr.args:
            b = bounds(arg, ranges)
            if b is None:
                return None
            cands = (lo * b[0], lo * b[1], hi * b[0], hi * b[1])
            lo, hi = min(cands), max(cands)
        return lo, hi
    if isinstance(expr, FloorDiv) and expr.args[1].is_Integer:
        b = bounds(expr.args[0], ranges)
        d = int(expr.args[1])
        return (b[0] // d, b[1] // d) if b is not None else None
    if isinstance(expr, ModularIndexing) and expr.args[2].is_Integer:
        return 0, int(expr.args[2]) - 1
    return None


def quotient(numerator: sympy.Expr, denominator: object) -> sympy.Expr:
    """``sympy.simplify(numerator / denominator)``: a size divided by a factor of it.

    The division cancels a monomial by itself (``2*s0*768 / 768`` is ``2*s0``), which
    ``simplify`` returns unchanged, so it is not asked: its first symbolic call imports
    ``sympy.physics`` (a second and more, once per process) and each call costs milliseconds.
    Other quotients are simplified once per expression."""
    q = numerator / sympify(denominator)
    if _is_monomial(q):
        return q  # type: ignore[no-any-return]
    return _simplified(q)


def _is_monomial(q: sympy.Expr) -> bool:
    """An integer times symbols to positive integer powers."""
    return bool(
        q.is_Integer
        or q.is_Symbol
        or (
            q.is_Mul
            and all(
                a.is_Integer
                or a.is_Symbol
                or (a.is_Pow and a.base.is_Symbol and a.exp.is_Integer and a.exp > 0)
                for a in q.args
            )
        )
    )


@functools.lru_cache(maxsize=4096)
def _simplified(expr: sympy.Expr) -> sympy.Expr:
    return sympy.simplify(expr)  # type: ignore[no-any-return]


def simplify_with_ranges(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Drop ``FloorDiv``/``ModularIndexing`` the symbols' ranges make trivial (cached)."""
    if not expr.args or expr.is_Atom:
        return expr
    return _simplify_cached(expr, tuple(sorted(ranges.items(), key=lambda kv: kv[0].name)))


@functools.lru_cache(maxsize=16384)
def _simplify_cached(expr: sympy.Expr, ranges: tuple[tuple[sympy.Symbol, int], ...]) -> sympy.Expr:
    return _simplify(sympy.expand(expr), dict(ranges))


def _simplify(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Drop ``FloorDiv``/``ModularIndexing`` the symbols' ranges make trivial.

    ``(x*8 + r) // 8`` is ``x`` when ``r < 8``; ``(r // 1) % 8`` is ``r`` then too.
    These rules are what let index equality decide fusion across flattened loops.
    """
    if not expr.args or expr.is_Atom:
        return expr
    args = [_simplify(a, ranges) for a in expr.args]
    expr = expr.func(*args)
    if isinstance(expr, FloorDiv):
        b = bounds(expr.args[0], ranges)
        d = static_int(expr.args[1])
        if b is not None and d is not None and b[0] >= 0 and b[1] < d:
            return sympy.S.Zero
        factored = _factor_divisor(expr.args[0], expr.args[1], ranges)
        return expr if factored is None else _simplify(FloorDiv(*factored), ranges)
    if isinstance(expr, ModularIndexing):
        base, div, mod = expr.args
        b = bounds(base, ranges)
        span = static_int(div * mod)
        if b is not None and span is not None and b[0] >= 0 and b[1] < span:
            return _simplify(FloorDiv(base, div), ranges)
        factored = _factor_divisor(base, div, ranges)
        if factored is None:
            return expr
        return _simplify(ModularIndexing(*factored, mod), ranges)
    if isinstance(expr, sympy.Add):
        return merge_digits(expr)
    return expr


def _factor_divisor(
    base: sympy.Expr, divisor_expr: sympy.Expr, ranges: dict[sympy.Symbol, int]
) -> tuple[sympy.Expr, sympy.Expr] | None:
    """``(base / m - rest, divisor / m)`` for the largest ``m`` dividing ``divisor`` and
    the coefficients of all terms of ``base`` but a remainder ``0 <= rest < m``:
    ``(56*r + c) // 802816`` is ``r // 14336`` when ``c < 56`` (a row of 56 columns
    lies in one block of 802816 elements). A symbolic divisor's integer factor counts
    alike: ``(r + 256*x) // (256*s1)`` is ``x // s1`` when ``r < 256``."""
    coeff, symbolic_part = sympy.sympify(divisor_expr).as_coeff_Mul()
    if not coeff.is_Integer or int(coeff) <= 1:
        return None
    divisor = int(coeff)
    terms = sympy.Add.make_args(base)
    coeffs = [t.as_coeff_Mul()[0] for t in terms]
    if not all(c.is_Integer for c in coeffs):
        return None
    candidates = sorted({math.gcd(divisor, int(c)) for c in coeffs} - {1}, reverse=True)
    for m in candidates:
        small = [t for t, c in zip(terms, coeffs, strict=True) if int(c) % m]
        b = bounds(sympy.Add(*small), ranges)
        if b is None or b[0] < 0 or b[1] >= m:
            continue
        big = sympy.Add(*[t for t, c in zip(terms, coeffs, strict=True) if not int(c) % m])
        return sympy.expand(big / m), sympy.Integer(divisor // m) * symbolic_part
    return None


def _digit(term: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr | None] | None:
    """``term`` as ``coeff * ((base // div) % mod)`` (mod None for a plain FloorDiv)."""
    digits = [f for f in sympy.Mul.make_args(term) if _is_digit(f)]
    if len(digits) != 1:
        return None
    rest = digits[0]
    coeff = sympy.Mul(*[f for f in sympy.Mul.make_args(term) if f is not rest])
    if isinstance(rest, ModularIndexing):
        return coeff, rest.args[0], rest.args[1], rest.args[2]
    if isinstance(rest, FloorDiv):
        return coeff, rest.args[0], rest.args[1], None
    return None


def _is_digit(factor: sympy.Expr) -> bool:
    """Whether ``factor`` is a digit of an index (``xindex // 24 % 8``), not a size in a
    coefficient (``(s2 - 1) // 2``, a stride of a strided convolution's output)."""
    if not isinstance(factor, (FloorDiv, ModularIndexing)):
        return False
    names = factor.args[0].free_symbols
    return len(names) > len(symbolic.size_symbols([factor.args[0]]))


def _flatten_digit(expr: sympy.Expr) -> sympy.Expr:
    """``(e // a % M) // d`` as ``e // (a*d) % (M/d)`` when ``d`` divides ``M``: a digit of a
    digit (a view of a view) becomes a digit of ``e``, which :func:`merge_digits` can rejoin."""
    base, divisor = expr.args
    if not (isinstance(base, ModularIndexing) and divisor.is_Integer):
        return expr
    inner, step, modulus = base.args
    if not (modulus.is_Integer and int(modulus) % int(divisor) == 0):
        return expr
    return ModularIndexing(inner, step * divisor, sympy.Integer(int(modulus) // int(divisor)))


def merge_digits(expr: sympy.Expr) -> sympy.Expr:
    """Rejoin the digits a flat index was split into: ``24*(x//24) + x%24`` is ``x``.

    Two terms ``c*m*digit(e, d*m, M) + c*digit(e, d, m)`` make ``c*digit(e, d, m*M)``;
    loopir emits such pairs whenever a contiguous buffer is indexed by several dims.
    """
    expr = sympy.sympify(expr)
    if not isinstance(expr, sympy.Add) or not expr.has(FloorDiv, ModularIndexing):
        return expr  # the simplifier calls this on every sum: most have no digits
    if expr.has(FloorDiv):
        expr = expr.replace(lambda e: isinstance(e, FloorDiv), _flatten_digit)
        if not isinstance(expr, sympy.Add):
            return expr
    terms = _gathered(list(expr.args))
    digits = [_digit(t) for t in terms]
    changed = True
    while changed:
        changed = False
        for i, j in itertools.permutations(range(len(terms)), 2):
            hi, lo = digits[i], digits[j]
            if hi is None or lo is None or lo[3] is None or hi[1] != lo[1]:
                continue
            c_hi, base, d_hi, m_hi = hi
            c_lo, _, d_lo, m_lo = lo
            if not (same(d_hi, d_lo * m_lo) and same(c_hi, c_lo * m_lo)):
                continue
            merged = (
                FloorDiv(base, d_lo) if m_hi is None else ModularIndexing(base, d_lo, m_lo * m_hi)
            )
            kept = [k for k in range(len(terms)) if k not in (i, j)]
            terms = _gathered([terms[k] for k in kept] + [c_lo * merged])
            digits = [_digit(t) for t in terms]
            changed = True
            break
    return sympy.Add(*terms)


def _gathered(terms: list[sympy.Expr]) -> list[sympy.Expr]:
    """``terms`` with those of one digit summed into one, ``q**2*d + 2*q*d + d`` as
    ``(q**2 + 2*q + 1)*d``: a symbolic stride (``(q + 1)**2``, expanded where it was
    computed) splits a digit's coefficient into monomials, and :func:`merge_digits` pairs
    digits by whole coefficients."""
    found: dict[sympy.Expr, list[sympy.Expr]] = {}
    rest: list[sympy.Expr] = []
    for term in terms:
        factors = sympy.Mul.make_args(term)
        digits = [f for f in factors if _is_digit(f)]
        if len(digits) != 1:
            rest.append(term)
            continue
        found.setdefault(digits[0], []).append(
            sympy.Mul(*[f for f in factors if f is not digits[0]])
        )
    if all(len(c) == 1 for c in found.values()):
        return terms  # nothing to gather (most sums): keep them as they were
    gathered = [sympy.Add(*c) * d for d, c in found.items()]
    return rest + [t for t in gathered if t != 0]


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether two sizes or indices are equal: structurally, else after expanding."""
    if a == b:
        return True
    return not (a.is_Integer and b.is_Integer) and sympy.expand(a - b) == 0
