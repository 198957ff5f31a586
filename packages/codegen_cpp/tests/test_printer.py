import operator
import re

import pytest
import sympy

from kiln.codegen_cpp.errors import CodegenCppError
from kiln.codegen_cpp.printer import cpp_float_literal, cpp_index
from kiln.loopir.sizes import FloorDiv, ModularIndexing
from kiln.loopir.testing import eval_index

x0 = sympy.Symbol("x0", integer=True, nonnegative=True)
x1 = sympy.Symbol("x1", integer=True, nonnegative=True)
i = sympy.Symbol("i", integer=True)


def _eval_cpp(text: str, env: dict[str, int]) -> int:
    """Evaluate printed C++ index arithmetic in Python with C's truncating / and %."""
    py = text.replace("kiln::floordiv<int64_t>", "floordiv").replace(
        "kiln::pymod<int64_t>", "pymod"
    )
    py = py.replace("kiln::imin", "min").replace("kiln::imax", "max")
    py = re.sub(r"INT64_C\((-?\d+)\)", r"\1", py)
    helpers = {"floordiv": operator.floordiv, "pymod": operator.mod}
    return eval_index(py, env, helpers, truncating=True)


def test_simple_affine():
    assert cpp_index(x0 + 16 * x1 + 3) == "x0 + 16 * x1 + 3"
    assert cpp_index(3 - x0 - x1) == "-x0 - x1 + 3"
    assert cpp_index(2**40 * x0) == "INT64_C(1099511627776) * x0"


def test_nonnegative_division_is_plain():
    assert cpp_index(ModularIndexing(x0, 4, 8)) == "(x0 / 4) % 8"
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert cpp_index(FloorDiv(x0 + x1 * s0, 7)) == "(x0 + x1 * s0) / 7"


def test_signed_operands_use_python_semantics():
    assert cpp_index(FloorDiv(i, 4)) == "kiln::floordiv<int64_t>(i, 4)"
    assert cpp_index(sympy.Mod(i, 3)) == "kiln::pymod<int64_t>(i, 3)"
    for value in (-7, -1, 0, 5, 9):
        assert _eval_cpp(cpp_index(FloorDiv(i, 4)), {"i": value}) == value // 4
        assert _eval_cpp(cpp_index(sympy.Mod(i, 3)), {"i": value}) == value % 3


def test_min_max_and_powers():
    assert "kiln::imax" in cpp_index(sympy.Max(x0 - 3, 0))
    assert cpp_index(x0**2) == "x0 * x0"


def test_float_literals():
    assert cpp_float_literal(float("inf"), "float") == "std::numeric_limits<float>::infinity()"
    assert cpp_float_literal(-float("inf"), "double") == "-std::numeric_limits<double>::infinity()"
    assert "quiet_NaN" in cpp_float_literal(float("nan"), "float")
    assert cpp_float_literal(0.5, "float") == "0.5f"
    assert cpp_float_literal(1e-40, "double") == "1e-40"


def test_floor_of_a_sum_is_one_division():
    # floor(x0/2 + x1/2) is not x0/2 + x1/2 in integers when both are odd
    text = cpp_index(sympy.floor(x0 / 2 + x1 / 2))
    assert text == "(x0 + x1) / 2"
    assert _eval_cpp(text, {"x0": 1, "x1": 3}) == 2


def test_non_integer_coefficients_are_refused():
    assert cpp_index(3 * x0 / 2) == "(3 * x0) / 2"
    with pytest.raises(CodegenCppError):
        cpp_index(0.5 * x0)


def test_values_match_sympy():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    cases = [
        x0 + 16 * x1 - 3,
        -2 * x0 * x1 + 5,
        FloorDiv(x0 - 3, 4),
        ModularIndexing(2 * x0 - i, 2, 8),
        ModularIndexing(x0 + x1 * s0, s0, 3),
        sympy.Mod(i * x1, 3),
        sympy.floor((i + x0) / (2 * s0)),
        sympy.Min(x0 - 3, i, 7) * x1**2,
    ]
    for expr in cases:
        text = cpp_index(expr)
        for vx0, vx1, vi, vs in ((0, 0, -7, 1), (1, 3, -1, 2), (5, 2, 0, 3), (9, 1, 4, 2)):
            point = {x0: vx0, x1: vx1, i: vi, s0: vs}
            want = int(expr.xreplace({k: sympy.Integer(v) for k, v in point.items()}))
            assert _eval_cpp(text, {k.name: v for k, v in point.items()}) == want, (expr, text)
