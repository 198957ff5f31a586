"""Sympy index expressions printed as Triton code.

loopir hands over storage positions built from ``+``, ``*``, ``FloorDiv`` and
``ModularIndexing`` of the flat ``xindex``/``rindex``. The kernel simplifies them
first with :func:`kiln.loopir.sizes.simplify_with_ranges`, which folds digit pairs
back together (``8*(x // 8) + x % 8`` is ``x``) and drops divisions the index ranges
make trivial, so a contiguous load prints as ``ptr + xindex`` and Triton sees a
unit-stride access it can vectorise.

The walk is loopir's :class:`~kiln.loopir.index_printer.IndexPrinter`; Triton spells
indices as Python does, except that ``Min``/``Max`` are ``tl.minimum``/``tl.maximum``
and integer ``//`` and ``%`` truncate toward zero. Index operands are almost always
provably non-negative, where truncation is floor division and the plain operators
print; elsewhere the kernel calls ``kh.int_floordiv``/``kh.int_remainder``.
"""

from __future__ import annotations

import sympy

from kiln.codegen_triton.errors import TritonCodegenError
from kiln.loopir.index_printer import IndexPrinter

__all__ = ["TritonIndexPrinter", "print_index"]


class TritonIndexPrinter(IndexPrinter):
    """Index expressions as Triton code."""

    dialect = "Triton code"
    error = TritonCodegenError

    def floordiv(self, num: sympy.Expr, den: sympy.Expr) -> str:
        if self.truncation_is_exact(num, den):
            return super().floordiv(num, den)
        return f"kh.int_floordiv({self.print(num)}, {self.print(den)})"

    def mod(self, num: sympy.Expr, den: sympy.Expr) -> str:
        if self.truncation_is_exact(num, den):
            return super().mod(num, den)
        return f"kh.int_remainder({self.print(num)}, {self.print(den)})"

    def min_max(self, is_max: bool) -> str:
        return "tl.maximum" if is_max else "tl.minimum"


_PRINTER = TritonIndexPrinter()


def print_index(expr: sympy.Expr) -> str:
    """Triton source for an index expression."""
    return _PRINTER.print(expr)
