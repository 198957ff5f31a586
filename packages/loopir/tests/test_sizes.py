"""Sympy helpers: integer functions, flattening, range-aware simplification."""

import sympy

from kiln.loopir import sizes

x, r = sizes.index_symbol("x", 0), sizes.index_symbol("r", 0)
S = sympy.Integer


def test_floordiv_and_modular_indexing_fold_constants_and_multiples():
    assert sizes.FloorDiv(S(17), S(5)) == 3
    assert sizes.FloorDiv(x * 8 + 3, S(8)) == x + sizes.FloorDiv(S(3), S(8))
    assert sizes.FloorDiv(x, S(1)) == x
    assert sizes.ModularIndexing(S(17), S(2), S(5)) == 3
    assert sizes.ModularIndexing(x * 40 + r, S(1), S(8)) == sizes.ModularIndexing(r, S(1), S(8))


def test_unflatten_then_simplify_recovers_the_loop_indices():
    flat = x * 8 + r
    parts = sizes.unflatten_index(flat, [S(4), S(8)])
    assert [sizes.simplify_with_ranges(p, {x: 4, r: 8}) for p in parts] == [x, r]
    assert sizes.unflatten_index(x, [S(1), S(5)])[0] == 0


def test_flat_index_and_strides():
    assert sizes.contiguous_strides([S(2), S(3), S(4)]) == [12, 4, 1]
    assert sizes.flat_index([x, r], [S(3), S(5)]) == 5 * x + r


def test_bounds():
    assert sizes.bounds(3 * x + r, {x: 4, r: 2}) == (0, 10)
    assert sizes.bounds(sizes.FloorDiv(x, S(2)), {x: 9}) == (0, 4)
    assert sizes.bounds(x + sympy.Symbol("n"), {x: 3}) is None


def test_sympify_and_static():
    assert sizes.sympify(3) == 3 and sizes.static_int(S(4)) == 4
    assert sizes.static_int(sympy.Symbol("s")) is None


def test_divisor_factored_past_a_bounded_remainder():
    """Rows of 56 columns lie inside one block of any multiple of 56 elements."""
    row, col = sizes.index_symbol("x", 1), sizes.index_symbol("x", 2)
    ranges = {row: 28672, col: 56}
    expr = sizes.FloorDiv(56 * row + col, S(802816))
    assert sizes.simplify_with_ranges(expr, ranges) == sizes.FloorDiv(row, S(14336))
    mod = sizes.ModularIndexing(56 * row + col, S(3136), S(256))
    assert sizes.simplify_with_ranges(mod, ranges) == sizes.ModularIndexing(row, S(56), S(256))
    # a remainder that may reach the divisor's factor keeps the expression
    wide = sizes.FloorDiv(56 * row + col, S(802816))
    assert sizes.simplify_with_ranges(wide, {row: 28672, col: 57}) == wide


def test_scaled_digits_rejoin():
    """A (24, 512, 64) view over a contiguous (2, 12, 512, 64) buffer reads at 32768*i."""
    i = sizes.index_symbol("v", 0)
    expr = 393216 * sizes.FloorDiv(i, S(12)) + 32768 * sizes.ModularIndexing(i, S(1), S(12))
    assert sizes.simplify_with_ranges(expr, {i: 24}) == 32768 * i
    wrapped = 393216 * sizes.ModularIndexing(i, S(12), S(2)) + 32768 * sizes.ModularIndexing(
        i, S(1), S(12)
    )
    assert sizes.simplify_with_ranges(wrapped, {i: 100}) == 32768 * sizes.ModularIndexing(
        i, S(1), S(24)
    )
