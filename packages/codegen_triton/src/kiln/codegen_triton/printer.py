"""Sympy index expressions printed as Triton code.

loopir hands over storage positions built from ``+``, ``*``, ``FloorDiv`` and
``ModularIndexing`` of the flat ``xindex``/``rindex``. The kernel simplifies them
first with :func:`kiln.loopir.sizes.simplify_with_ranges`, which folds digit pairs
back together (``8*(x // 8) + x % 8`` is ``x``) and drops divisions the index ranges
make trivial, so a contiguous load prints as ``ptr + xindex`` and Triton sees a
unit-stride access it can vectorise.
"""

from __future__ import annotations

import sympy

from kiln.codegen_triton.errors import TritonCodegenError
from kiln.loopir import sizes

__all__ = ["print_index"]

FloorDiv = sizes.FloorDiv
ModularIndexing = sizes.ModularIndexing


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
