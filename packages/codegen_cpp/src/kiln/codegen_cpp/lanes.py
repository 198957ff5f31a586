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

import sympy

from kiln.loopir.sizes import FloorDiv, ModularIndexing, merge_digits

__all__ = ["LaneAccess", "lane_access"]

_CHUNK = sympy.Symbol("kiln_chunk", integer=True, nonnegative=True)


@dataclasses.dataclass(frozen=True)
class LaneAccess:
    """``index(v + lane) == base + stride * lane`` (``base`` is ``index(v)``)."""

    base: sympy.Expr
    stride: sympy.Expr


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
