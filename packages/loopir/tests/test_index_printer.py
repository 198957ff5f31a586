"""The shared index printer: structure of the text, and its value against sympy's.

The Python dialect (the class itself) is evaluated with Python's floor ``//``/``%``; a
C-like dialect defined here, whose operators truncate toward zero and whose helpers
floor, is evaluated under truncation: both must equal sympy's value of the expression
at every point of a grid, signed operands included.
"""

from __future__ import annotations

import itertools
import random

import pytest
import sympy

from kiln.loopir.errors import BackendError
from kiln.loopir.index_printer import IndexPrinter, is_nonnegative, is_positive
from kiln.loopir.sizes import FloorDiv, ModularIndexing
from kiln.loopir.testing import eval_index

x = sympy.Symbol("x", integer=True, nonnegative=True)
y = sympy.Symbol("y", integer=True, nonnegative=True)
s = sympy.Symbol("s", integer=True, positive=True)
i = sympy.Symbol("i", integer=True)
PY = IndexPrinter()


class CLike(IndexPrinter):
    """Truncating ``/`` and ``%``, spaced operators, ``floordiv``/``pymod`` helpers."""

    dialect = "C-like"

    def product(self, factors: list[str]) -> str:
        return " * ".join(factors)

    def floordiv(self, num: sympy.Expr, den: sympy.Expr) -> str:
        if self.truncation_is_exact(num, den):
            return f"({self.operand(num)} / {self._divisor(den)})"
        return f"floordiv({self.print(num)}, {self.print(den)})"

    def mod(self, num: sympy.Expr, den: sympy.Expr) -> str:
        if self.truncation_is_exact(num, den):
            return f"({self.operand(num)} % {self._divisor(den)})"
        return f"pymod({self.print(num)}, {self.print(den)})"

    def min_max(self, is_max: bool) -> str:
        return "imax" if is_max else "imin"


def eval_python(text: str, env: dict[str, int]) -> int:
    return eval_index(text, env)


def eval_truncating(text: str, env: dict[str, int]) -> int:
    helpers = {"floordiv": lambda a, b: a // b, "pymod": lambda a, b: a % b}
    return eval_index(text, env, {**helpers, "imin": min, "imax": max}, truncating=True)


def _random_index(rng: random.Random, depth: int) -> sympy.Expr:
    """A random integer index expression over ``x, y, s, i`` with positive divisors."""
    if depth == 0:
        return rng.choice([x, y, s, i, x, y, sympy.Integer(rng.choice([0, 1, 3, 8, -2]))])
    a, b = _random_index(rng, depth - 1), _random_index(rng, depth - 1)
    divisor = rng.choice([2, 3, 8, s, 2 * s, s**2])
    return rng.choice(
        [
            lambda: a + b,
            lambda: a - b,
            lambda: a * b,
            lambda: rng.choice([-1, 2, -3, 16]) * a + b,
            lambda: FloorDiv(a, divisor),
            lambda: ModularIndexing(a, rng.choice([1, 2, 4, s]), rng.choice([3, 8, s])),
            lambda: sympy.Mod(a, divisor),
            lambda: sympy.floor(a / divisor),
            lambda: sympy.Max(a, b) if rng.random() < 0.5 else sympy.Min(a, b, 5),
            lambda: a ** rng.choice([2, 3]),
            lambda: (a + b) * divisor / divisor,
        ]
    )()


def _grid() -> list[dict[sympy.Symbol, int]]:
    return [
        {x: vx, y: vy, s: vs, i: vi}
        for vx, vy, vs, vi in itertools.product([0, 3, 7], [0, 5], [1, 2, 3], [-7, -1, 0, 4])
    ]


def _check_values(printer: IndexPrinter, evaluate, seed: int, count: int) -> None:
    rng = random.Random(seed)
    for _ in range(count):
        expr = _random_index(rng, rng.randrange(1, 4))
        text = printer.print(expr)
        for point in _grid():
            want = expr.xreplace({k: sympy.Integer(v) for k, v in point.items()})
            got = evaluate(text, {k.name: v for k, v in point.items()})
            assert got == int(want), (expr, text, point)


def test_sums_put_constants_last_and_subtract_negative_terms():
    assert PY.print(3 + x + 16 * y) == "x + 16*y + 3"
    assert PY.print(3 - x - 2 * y) == "-x - 2*y + 3"
    assert PY.print(x - 4 * y) == "x - 4*y"
    assert PY.print(sympy.Integer(-5)) == "-5"


def test_products_pow_min_max_and_integer_functions():
    assert PY.print(-x * y) == "-x*y"
    assert PY.print(-3 * x) == "-3*x"
    assert PY.print(y * (2 * x + 2)) == "y*(2*x + 2)"
    assert PY.print(x**3) == "x*x*x"
    assert PY.print(sympy.Max(x, y, 4)) == "max(max(4, x), y)"
    assert PY.print(FloorDiv(x + 3, 8)) == "((x + 3) // 8)"
    assert PY.print(ModularIndexing(x, 4, 8)) == "((x // 4) % 8)"
    assert PY.print(ModularIndexing(x, 1, 8)) == "(x % 8)"
    assert PY.print(sympy.Mod(i, 3)) == "(i % 3)"


def test_a_product_divisor_is_parenthesised():
    assert PY.print(FloorDiv(x, 2 * s)) == "(x // (2*s))"
    assert PY.print(ModularIndexing(x, 1, s**2)) == "(x % (s*s))"


def test_rational_coefficients_and_floor_of_a_sum_are_one_floor_division():
    assert PY.print(x / 2) == "(x // 2)"
    assert PY.print(3 * x / 2 + 1) == "(3*x // 2) + 1"
    # floor((x + y)/2) is not x//2 + y//2 when both are odd
    assert PY.print(sympy.floor(x / 2 + y / 2)) == "((x + y) // 2)"


def test_unprintable_expressions_raise_the_dialect_error():
    with pytest.raises(BackendError, match="as Python"):
        PY.print(sympy.sin(x))
    with pytest.raises(BackendError):
        PY.print(0.5 * x)  # a float coefficient is no index arithmetic

    class Mine(IndexPrinter):
        dialect = "Mine"
        error = KeyError

    with pytest.raises(KeyError, match="as Mine"):
        Mine().print(x**-1)


def test_hooks_shape_every_occurrence():
    c = CLike()
    assert c.print(2 * x * y + 3) == "2 * x * y + 3"
    assert c.print(FloorDiv(x, 4)) == "(x / 4)"
    assert c.print(FloorDiv(i, 4)) == "floordiv(i, 4)"
    assert c.print(ModularIndexing(x - 1, 1, 8)) == "pymod(x - 1, 8)"
    assert c.print(sympy.Min(x, y)) == "imin(x, y)"


def test_sign_analysis():
    assert is_nonnegative(FloorDiv(x + y, 3)) and is_nonnegative(sympy.Max(i, x))
    assert not is_nonnegative(x - 1) and not is_nonnegative(sympy.Min(i, x))
    assert is_positive(2 * s) and not is_positive(x)


def test_python_dialect_values_match_sympy():
    _check_values(PY, eval_python, seed=0, count=60)


def test_truncating_dialect_values_match_sympy():
    _check_values(CLike(), eval_truncating, seed=1, count=60)
