"""Index expressions printed as source code: one walk, a dialect per code generator.

Storage positions reach a code generator as sympy expressions over index symbols built
from ``+``, ``*``, integer powers, ``Min``/``Max`` and loopir's ``FloorDiv`` and
``ModularIndexing`` (sympy's own ``Mod`` and ``floor`` where sizes were built by sympy).
:class:`IndexPrinter` walks that tree once: sums put constants last and print negative
terms as subtractions, products put the integer coefficient first, ``x/2`` is a floor
division, ``Min``/``Max`` of several arguments nest two at a time. What a target spells
differently (literals, operators, parentheses, the min/max functions) is a method a
code generator overrides in a subclass. The class itself prints Python, which the tests
evaluate against sympy.

``//`` and ``%`` keep Python's floor semantics in every dialect: sympy's ``Mod`` and
``floor`` mean them, and loopir's ``FloorDiv``/``ModularIndexing`` evaluate with them
(their operands are non-negative by construction, but a sum may not be provably so
once sympy has split it). A dialect whose operators truncate toward zero (C, Triton)
prints the plain operator where :meth:`IndexPrinter.truncation_is_exact` says the two
agree, and a floor-correct helper elsewhere.
"""

from __future__ import annotations

from typing import ClassVar

import sympy

from kiln.loopir.errors import BackendError
from kiln.loopir.sizes import FloorDiv, ModularIndexing

__all__ = ["IndexPrinter", "is_nonnegative", "is_positive"]


def is_nonnegative(expr: sympy.Expr) -> bool:
    """Provably >= 0; knows that loopir's integer functions keep signs."""
    if expr.is_nonnegative:
        return True
    if isinstance(expr, (sympy.Add, sympy.Mul, FloorDiv, ModularIndexing, sympy.Min)):
        return all(is_nonnegative(arg) for arg in expr.args)
    if isinstance(expr, sympy.Max):
        return any(is_nonnegative(arg) for arg in expr.args)
    return False


def is_positive(expr: sympy.Expr) -> bool:
    """Provably > 0 (a product of positive factors included)."""
    return bool(expr.is_positive) or (
        isinstance(expr, sympy.Mul) and all(is_positive(arg) for arg in expr.args)
    )


class IndexPrinter:
    """Prints an integer index expression; subclasses override the dialect hooks."""

    dialect: ClassVar[str] = "Python"
    """Named in the error for an expression the dialect cannot print."""
    error: ClassVar[type[Exception]] = BackendError
    """What :meth:`print` raises for such an expression (a code generator's own error)."""

    def print(self, expr: sympy.Expr | int) -> str:
        """Source for ``expr`` in this dialect; raises :attr:`error` for what it cannot print."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return self.integer(int(expr))
        if isinstance(expr, sympy.Symbol):
            return self.symbol(expr)
        if isinstance(expr, sympy.Add):
            return self._sum(expr)
        if isinstance(expr, sympy.Mul):
            return self._product(expr)
        if isinstance(expr, FloorDiv):
            return self.floordiv(*expr.args)
        if isinstance(expr, ModularIndexing):
            base, div, mod = expr.args
            return self.mod(FloorDiv(base, div), mod)
        if isinstance(expr, sympy.Mod):
            return self.mod(*expr.args)
        if isinstance(expr, sympy.floor):
            num, den = sympy.fraction(sympy.together(expr.args[0]))
            return self.floordiv(num, den)
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
            return self.product([self.operand(expr.base)] * int(expr.exp))
        if isinstance(expr, (sympy.Min, sympy.Max)):
            fn = self.min_max(isinstance(expr, sympy.Max))
            args = [self.print(a) for a in expr.args]
            text = args[0]
            for arg in args[1:]:
                text = f"{fn}({text}, {arg})"
            return text
        raise self._unprintable(expr)

    # -- dialect hooks ---------------------------------------------------------------------

    def integer(self, value: int) -> str:
        """An integer literal."""
        return str(value)

    def symbol(self, sym: sympy.Symbol) -> str:
        """An index symbol: its name."""
        return sym.name

    def operand(self, expr: sympy.Expr) -> str:
        """``expr`` as an operand of ``*``, ``//``, ``%`` or unary minus: sums parenthesised."""
        text = self.print(expr)
        return f"({text})" if isinstance(expr, sympy.Add) else text

    def product(self, factors: list[str]) -> str:
        """Factors (already operands) multiplied."""
        return "*".join(factors)

    def negate(self, text: str) -> str:
        """Minus a product (``text`` from :meth:`product`)."""
        return f"-{text}"

    def floordiv(self, num: sympy.Expr, den: sympy.Expr) -> str:
        """``num // den``, rounding toward minus infinity for operands of any sign."""
        return f"({self.operand(num)} // {self._divisor(den)})"

    def mod(self, num: sympy.Expr, den: sympy.Expr) -> str:
        """``num % den``, the remainder of :meth:`floordiv` (the divisor's sign)."""
        return f"({self.operand(num)} % {self._divisor(den)})"

    def min_max(self, is_max: bool) -> str:
        """The two-argument function that takes the larger (``is_max``) or smaller operand."""
        return "max" if is_max else "min"

    def truncation_is_exact(self, num: sympy.Expr, den: sympy.Expr) -> bool:
        """Whether truncating division of ``num`` by ``den`` equals floor division: both
        provably non-negative, the divisor positive."""
        return is_nonnegative(num) and is_positive(den)

    # -- the walk --------------------------------------------------------------------------

    def _sum(self, expr: sympy.Add) -> str:
        # sympy's order, constants last (x0 + 16*x1 + 3): stable text for golden files
        terms = sorted(expr.args, key=lambda t: (bool(t.is_Number), sympy.default_sort_key(t)))
        text = self.print(terms[0])
        for term in terms[1:]:
            coeff, _ = term.as_coeff_Mul()
            if coeff.is_negative:
                negated = -term
                shown = self.operand(negated) if negated.is_Add else self.print(negated)
                text += f" - {shown}"
            else:
                text += f" + {self.print(term)}"
        return text

    def _product(self, expr: sympy.Mul) -> str:
        coeff, rest = expr.as_coeff_Mul()
        factors = sympy.Mul.make_args(rest)
        if not coeff.is_Integer or any(f.is_Rational and not f.is_Integer for f in factors):
            # x/2 and the like: an integer index only divides through a floor division
            num, den = sympy.fraction(expr)
            if den != 1:
                return self.floordiv(num, den)
            if coeff != int(coeff):
                raise self._unprintable(expr)
        parts = [self.operand(f) for f in factors]
        if coeff == -1:
            return self.negate(self.product(parts))
        if coeff != 1:
            parts.insert(0, self.operand(sympy.Integer(int(coeff))))
        return self.product(parts)

    def _divisor(self, expr: sympy.Expr) -> str:
        # ``a // 2*s`` is ``(a // 2)*s``: a product on the right of ``//`` or ``%`` needs
        # parentheses where it needs none as a factor
        text = self.operand(expr)
        return f"({text})" if isinstance(expr, (sympy.Mul, sympy.Pow)) else text

    def _unprintable(self, expr: sympy.Expr) -> Exception:
        msg = f"cannot print index expression {expr} ({type(expr).__name__}) as {self.dialect}"
        return self.error(msg)
