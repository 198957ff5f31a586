"""Sympy index expressions printed as C++ ``int64_t`` arithmetic.

Index expressions (loopir's ``FloorDiv``/``ModularIndexing``, sympy's ``Mod``,
``floor``, ``Min``/``Max``, integer powers) become C++ with Python's floor
semantics: when sympy can prove both operands non-negative the plain (and
faster) ``/`` and ``%`` are exact; otherwise the kernel calls
``kiln::floordiv``/``kiln::pymod`` from ``kiln_scalar.h``.
"""

from __future__ import annotations

import math

import sympy

from kiln.codegen_cpp.errors import CodegenCppError
from kiln.loopir.sizes import FloorDiv, ModularIndexing

__all__ = ["cpp_index", "cpp_float_literal", "cpp_int_literal"]

_INT32_MAX = 2**31 - 1


def cpp_int_literal(value: int) -> str:
    """An integer literal that is ``int64_t`` whenever ``int`` could overflow."""
    if -_INT32_MAX <= value <= _INT32_MAX:
        return str(value)
    return f"INT64_C({value})"


def cpp_float_literal(value: float, ctype: str) -> str:
    """A literal of ``ctype`` (``float``/``double``), infinities and NaN included."""
    if math.isnan(value):
        return f"std::numeric_limits<{ctype}>::quiet_NaN()"
    if math.isinf(value):
        sign = "-" if value < 0 else ""
        return f"{sign}std::numeric_limits<{ctype}>::infinity()"
    text = repr(float(value))
    return f"{text}f" if ctype == "float" else text


def _nonneg(expr: sympy.Expr) -> bool:
    """Provably >= 0; knows that loopir's integer functions keep signs."""
    if expr.is_nonnegative:
        return True
    if isinstance(expr, (sympy.Add, sympy.Mul, FloorDiv, ModularIndexing, sympy.Min)):
        return all(_nonneg(arg) for arg in expr.args)
    if isinstance(expr, sympy.Max):
        return any(_nonneg(arg) for arg in expr.args)
    return False


def _positive(expr: sympy.Expr) -> bool:
    return bool(expr.is_positive) or (
        isinstance(expr, sympy.Mul) and all(_positive(arg) for arg in expr.args)
    )


def _atom(text: str) -> str:
    """``text`` parenthesised unless it already is one operand (name, number, call)."""
    if text.replace("_", "").replace("::", "").isalnum():
        return text
    depth = 0
    for pos, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0 and pos != len(text) - 1:
                return f"({text})"
        elif depth == 0 and not (char.isalnum() or char in "_:<>"):
            return f"({text})"
    return text


def _floordiv(num: sympy.Expr, den: sympy.Expr) -> str:
    a, b = cpp_index(num), cpp_index(den)
    if _nonneg(num) and _positive(den):
        return f"{_atom(a)} / {_atom(b)}"
    return f"kiln::floordiv<int64_t>({a}, {b})"


def _mod(num: sympy.Expr, den: sympy.Expr) -> str:
    a, b = _atom(cpp_index(num)), _atom(cpp_index(den))
    if _nonneg(num) and _positive(den):
        return f"{a} % {b}"
    return f"kiln::pymod<int64_t>({a}, {b})"


def _print_mul(expr: sympy.Mul) -> str:
    coeff, rest = expr.as_coeff_Mul()
    factors = sympy.Mul.make_args(rest)
    if not coeff.is_Integer or any(f.is_Rational and not f.is_Integer for f in factors):
        # x/2 and the like: an integer index only divides through FloorDiv.
        num, den = sympy.fraction(expr)
        if den != 1:
            return _floordiv(num, den)
    parts = [_atom(cpp_index(f)) for f in factors]
    if coeff == -1:
        return f"-{_atom(' * '.join(parts))}" if len(parts) > 1 else f"-{parts[0]}"
    if coeff != 1:
        parts.insert(0, _atom(cpp_int_literal(int(coeff))))
    return " * ".join(parts)


def _print_add(expr: sympy.Add) -> str:
    terms = sorted(expr.args, key=sympy.default_sort_key)
    # Constants last reads naturally: x0 + 16*x1 + 3.
    terms.sort(key=lambda t: t.is_Number)
    out = cpp_index(terms[0])
    for term in terms[1:]:
        coeff, _ = term.as_coeff_Mul()
        if coeff.is_negative:
            negated = cpp_index(-term)
            out += f" - {_atom(negated) if (-term).is_Add else negated}"
        else:
            out += f" + {cpp_index(term)}"
    return out


def cpp_index(expr: sympy.Expr | int) -> str:
    """C++ for an integer index expression; symbols print as their names."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return cpp_int_literal(int(expr))
    if isinstance(expr, sympy.Symbol):
        return expr.name
    if isinstance(expr, sympy.Add):
        return _print_add(expr)
    if isinstance(expr, sympy.Mul):
        return _print_mul(expr)
    if isinstance(expr, FloorDiv):
        return _floordiv(*expr.args)
    if isinstance(expr, ModularIndexing):
        base, div, mod = expr.args
        return _mod(FloorDiv(base, div), mod)
    if isinstance(expr, sympy.Mod):
        return _mod(*expr.args)
    if isinstance(expr, sympy.floor):
        num, den = sympy.fraction(expr.args[0])
        return _floordiv(num, den)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        base = _atom(cpp_index(expr.base))
        return " * ".join([base] * int(expr.exp))
    if isinstance(expr, (sympy.Min, sympy.Max)):
        fn = "kiln::imin" if isinstance(expr, sympy.Min) else "kiln::imax"
        args = [cpp_index(a) for a in expr.args]
        out = args[0]
        for arg in args[1:]:
            out = f"{fn}({out}, {arg})"
        return out
    msg = f"cannot print index expression {expr} ({type(expr).__name__}) as C++"
    raise CodegenCppError(msg)
