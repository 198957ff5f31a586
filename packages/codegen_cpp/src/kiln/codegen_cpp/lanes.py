"""How an index expression moves across the lanes of a vectorized loop.

The vectorized loop steps its variable ``v`` by ``L`` lanes from 0, so each
step starts at a multiple of ``L``. For an index ``e(v)`` we want ``e(v + i) ==
e(v) + s*i`` for lanes ``i < L``: stride 0 is a broadcast, 1 a contiguous load,
any other known ``s`` a strided gather. Loopir's ``FloorDiv``/``ModularIndexing``
keep that shape when the lanes cannot cross a block boundary; otherwise the
answer is None and the kernel computes the index lane by lane.
"""

from __future__ import annotations

import dataclasses
import itertools

import sympy

from kiln.loopir.sizes import FloorDiv, ModularIndexing

__all__ = ["LaneAccess", "lane_access", "merge_digits"]

_CHUNK = sympy.Symbol("kiln_chunk", integer=True, nonnegative=True)


@dataclasses.dataclass(frozen=True)
class LaneAccess:
    """``index(v + lane) == base + stride * lane`` (``base`` is ``index(v)``)."""

    base: sympy.Expr
    stride: sympy.Expr


def _digit(term: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr | None] | None:
    """``term`` as ``coeff * ((base // div) % mod)`` (mod None for a plain FloorDiv)."""
    digits = [f for f in sympy.Mul.make_args(term) if isinstance(f, (FloorDiv, ModularIndexing))]
    if len(digits) != 1:
        return None
    rest = digits[0]
    coeff = sympy.Mul(*[f for f in sympy.Mul.make_args(term) if f is not rest])
    if isinstance(rest, ModularIndexing):
        return coeff, rest.args[0], rest.args[1], rest.args[2]
    if isinstance(rest, FloorDiv):
        return coeff, rest.args[0], rest.args[1], None
    return None


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
    if not isinstance(expr, sympy.Add):
        return expr
    expr = expr.replace(lambda e: isinstance(e, FloorDiv), _flatten_digit)
    if not isinstance(expr, sympy.Add):
        return expr
    terms = list(expr.args)
    changed = True
    while changed:
        changed = False
        for i, j in itertools.permutations(range(len(terms)), 2):
            hi, lo = _digit(terms[i]), _digit(terms[j])
            if hi is None or lo is None or lo[3] is None or hi[1] != lo[1]:
                continue
            c_hi, base, d_hi, m_hi = hi
            c_lo, _, d_lo, m_lo = lo
            if sympy.expand(d_hi - d_lo * m_lo) != 0 or sympy.expand(c_hi - c_lo * m_lo) != 0:
                continue
            merged = (
                FloorDiv(base, d_lo) if m_hi is None else ModularIndexing(base, d_lo, m_lo * m_hi)
            )
            terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [c_lo * merged]
            changed = True
            break
    return sympy.Add(*terms)


def lane_access(index: sympy.Expr, var: sympy.Symbol, lanes: int) -> LaneAccess | None:
    """The lane-affine form of ``index`` along ``var``, or None when it has none."""
    split = _split(merge_digits(index), var, lanes)
    if split is None:
        return None
    return LaneAccess(split[0], sympy.sympify(split[1]))


def _multiple_of(expr: sympy.Expr, var: sympy.Symbol, lanes: int, factor: sympy.Expr) -> bool:
    """True when ``expr`` is a multiple of ``factor`` whenever ``var`` is a multiple of ``lanes``."""
    ratio = sympy.expand(expr.subs(var, lanes * _CHUNK) / factor)
    return bool(ratio.is_integer)


def _split(expr: sympy.Expr, var: sympy.Symbol, lanes: int) -> tuple[sympy.Expr, sympy.Expr] | None:
    if not expr.has(var):
        return expr, sympy.S.Zero
    if expr == var:
        return expr, sympy.S.One
    if isinstance(expr, sympy.Add):
        base, stride = sympy.S.Zero, sympy.S.Zero
        for arg in expr.args:
            part = _split(arg, var, lanes)
            if part is None:
                return None
            base, stride = base + part[0], stride + part[1]
        return base, stride
    if isinstance(expr, sympy.Mul):
        varying = [a for a in expr.args if a.has(var)]
        if len(varying) != 1:
            return None
        rest = sympy.Mul(*[a for a in expr.args if not a.has(var)])
        part = _split(varying[0], var, lanes)
        return None if part is None else (rest * part[0], rest * part[1])
    if isinstance(expr, (FloorDiv, ModularIndexing)):
        return _split_digit(expr, var, lanes)
    return None


def _split_digit(
    expr: FloorDiv | ModularIndexing, var: sympy.Symbol, lanes: int
) -> tuple[sympy.Expr, sympy.Expr] | None:
    inner = _split(expr.args[0], var, lanes)
    if inner is None:
        return None
    base, stride = inner
    divisor = expr.args[1]
    rebuilt = expr.func(base, *expr.args[1:])
    if stride == 0:
        return rebuilt, sympy.S.Zero
    if not (stride.is_Integer and int(stride) > 0 and divisor.is_Integer):
        return None
    span = int(stride) * lanes  # the values the lanes cover: [base, base + span)
    if not _multiple_of(base, var, lanes, sympy.Integer(span)):
        return None
    if int(divisor) % span == 0:
        return rebuilt, sympy.S.Zero  # one block of the divisor holds every lane
    if isinstance(expr, ModularIndexing) and divisor == 1:
        modulus = expr.args[2]
        if modulus.is_Integer and int(modulus) % span == 0:
            return rebuilt, stride
    return None
