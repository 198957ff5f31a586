"""Sympy index expressions printed as C++ ``int64_t`` arithmetic.

Index expressions (loopir's ``FloorDiv``/``ModularIndexing``, sympy's ``Mod``,
``floor``, ``Min``/``Max``, integer powers) become C++ with Python's floor
semantics: when sympy can prove both operands non-negative the plain (and
faster) ``/`` and ``%`` are exact; otherwise the kernel calls
``kiln::floordiv``/``kiln::pymod`` from ``kiln_scalar.h``. The walk over the
expression is loopir's :class:`~kiln.loopir.index_printer.IndexPrinter`; this module
holds the C++ spelling: ``int64_t`` literals, spaced operators, and parentheses
wherever an operand's text is not one token.
"""

from __future__ import annotations

import math

import sympy

from kiln.codegen_cpp.errors import CodegenCppError
from kiln.loopir.index_printer import IndexPrinter

__all__ = ["CppIndexPrinter", "cpp_index", "cpp_float_literal", "cpp_int_literal"]

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


class CppIndexPrinter(IndexPrinter):
    """Index expressions as C++ ``int64_t`` arithmetic with Python's floor semantics."""

    dialect = "C++"
    error = CodegenCppError

    def integer(self, value: int) -> str:
        return cpp_int_literal(value)

    def operand(self, expr: sympy.Expr) -> str:
        return _atom(self.print(expr))

    def product(self, factors: list[str]) -> str:
        return " * ".join(factors)

    def negate(self, text: str) -> str:
        return f"-{_atom(text)}"

    def floordiv(self, num: sympy.Expr, den: sympy.Expr) -> str:
        if self.truncation_is_exact(num, den):
            return f"{self.operand(num)} / {self.operand(den)}"
        return f"kiln::floordiv<int64_t>({self.print(num)}, {self.print(den)})"

    def mod(self, num: sympy.Expr, den: sympy.Expr) -> str:
        a, b = self.operand(num), self.operand(den)
        if self.truncation_is_exact(num, den):
            return f"{a} % {b}"
        return f"kiln::pymod<int64_t>({a}, {b})"

    def min_max(self, is_max: bool) -> str:
        return "kiln::imax" if is_max else "kiln::imin"


_PRINTER = CppIndexPrinter()


def cpp_index(expr: sympy.Expr | int) -> str:
    """C++ for an integer index expression; symbols print as their names."""
    return _PRINTER.print(expr)
