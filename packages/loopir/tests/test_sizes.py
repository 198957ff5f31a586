"""Sympy helpers: integer functions, flattening, range-aware simplification."""

import pytest
import sympy

from kiln.loopir import sizes

x, r = sizes.index_symbol("x", 0), sizes.index_symbol("r", 0)
xindex = sympy.Symbol("xindex", integer=True, nonnegative=True)
rindex = sympy.Symbol("rindex", integer=True, nonnegative=True)
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


def test_a_digit_of_a_digit_is_a_digit():
    inner = sizes.ModularIndexing(x, S(1), S(256))
    assert sizes.ModularIndexing(inner, S(1), S(64)) == sizes.ModularIndexing(x, S(1), S(64))
    assert sizes.ModularIndexing(inner, S(4), S(16)) == sizes.ModularIndexing(x, S(4), S(16))
    kept = sizes.ModularIndexing(inner, S(1), S(48))  # 48 does not divide 256
    assert kept.args[0] == inner
    for d, m_in, a, m in [(1, 12, 2, 3), (2, 48, 4, 4), (3, 256, 1, 16)]:
        e = sizes.ModularIndexing(sizes.ModularIndexing(x, S(d), S(m_in)), S(a), S(m))
        for v in range(0, 2000, 7):
            assert int(e.subs(x, v)) == ((v // d % m_in) // a) % m


def test_digits_of_quotients_and_quotients_of_digits_take_one_form():
    """``(e // a) // d % m`` and ``(e // s % M) // d`` (d dividing M) are digits of ``e``, so
    the digits of a window partition's reshape rejoin: Swin's (2, 8, 8, 7, 7, 96) windows read
    as (6272, 96) rows are the buffer itself, not a copy."""
    assert sizes.ModularIndexing(sizes.FloorDiv(x, S(49)), S(1), S(64)) == (
        sizes.ModularIndexing(x, S(49), S(64))
    )
    assert sizes.FloorDiv(sizes.ModularIndexing(x, S(1), S(49)), S(7)) == (
        sizes.ModularIndexing(x, S(7), S(7))
    )
    kept = sizes.FloorDiv(sizes.ModularIndexing(x, S(1), S(48)), S(5))  # 5 does not divide 48
    assert isinstance(kept, sizes.FloorDiv)
    for v in range(0, 3000, 11):
        assert int(sizes.ModularIndexing(sizes.FloorDiv(x, S(6)), S(4), S(5)).subs(x, v)) == (
            (v // 6) // 4 % 5
        )
        assert int(sizes.FloorDiv(sizes.ModularIndexing(x, S(3), S(24)), S(4)).subs(x, v)) == (
            (v // 3 % 24) // 4
        )
    v = sizes.index_symbol("v", 0)
    windows = (
        301056 * sizes.FloorDiv(v, S(3136))
        + 672 * sizes.FloorDiv(sizes.ModularIndexing(v, S(1), S(49)), S(7))
        + 96 * sizes.ModularIndexing(v, S(1), S(7))
        + 4704 * sizes.ModularIndexing(sizes.FloorDiv(v, S(49)), S(1), S(64))
    )
    assert sizes.simplify_with_ranges(windows, {v: 6272}) == 96 * v


def test_reshape_index_splits_only_the_dims_that_change():
    b, t, c = sizes.index_symbol("x", 1), sizes.index_symbol("x", 2), sizes.index_symbol("x", 3)
    # (4, 128, 4, 64) seen as (4, 128, 256), indexed at a cat piece's shifted c - 512
    got = sizes.reshape_index([b, t, c - 512], [S(4), S(128), S(256)], [S(4), S(128), S(4), S(64)])
    assert got == [b, t, sizes.FloorDiv(c, S(64)) - 8, sizes.ModularIndexing(c, S(1), S(64))]
    # no common runs but the whole: the flat position is split
    assert sizes.reshape_index([b, t], [S(6), S(4)], [S(4), S(6)]) == sizes.unflatten_index(
        4 * b + t, [S(4), S(6)]
    )
    # size-1 dims on either side
    assert sizes.reshape_index([b], [S(4)], [S(4), S(1)]) == [b, 0]
    assert sizes.reshape_index([b, t], [S(4), S(1)], [S(4)]) == [b]


def test_merge_digits_rejoins_flat_indices():
    assert sizes.merge_digits(24 * sizes.FloorDiv(x, 24) + sizes.ModularIndexing(x, 1, 24)) == x
    three = (
        960 * sizes.FloorDiv(x, 960)
        + 24 * sizes.ModularIndexing(x, 24, 40)
        + sizes.ModularIndexing(x, 1, 24)
    )
    assert sizes.merge_digits(three) == x
    transposed = sizes.FloorDiv(x, 24) + 40 * sizes.ModularIndexing(x, 1, 24)
    assert sizes.merge_digits(transposed) == transposed
    s = sympy.Symbol("s1", integer=True, positive=True)
    assert sizes.merge_digits(s * sizes.FloorDiv(x, s) + sizes.ModularIndexing(x, 1, s)) == x


def test_merge_digits_sees_through_a_digit_of_a_digit():
    # a contiguous (4, 4, 128, 64) buffer read as (16, 128, 64): loopir's index of the view
    view = (
        32768 * sizes.FloorDiv(x, 32768)
        + 64 * sizes.FloorDiv(sizes.ModularIndexing(x, 1, 8192), 64)
        + sizes.ModularIndexing(x, 1, 64)
        + 8192 * sizes.ModularIndexing(x, 8192, 4)
    )
    assert sizes.merge_digits(view) == x
    assert sizes.merge_digits(
        sizes.FloorDiv(sizes.ModularIndexing(x, 1, 100), 8)
    ) == sizes.FloorDiv(sizes.ModularIndexing(x, 1, 100), 8)


# flat kernel indices as a code generator hands them over
def test_contiguous_digits_fold_back_to_the_flat_index():
    expr = 8 * sizes.FloorDiv(xindex, 8) + sizes.ModularIndexing(xindex, 1, 8)
    assert sizes.simplify_with_ranges(expr, {xindex: 32}) == xindex


def test_three_digits_fold():
    expr = (
        20 * sizes.FloorDiv(xindex, 20)
        + 5 * sizes.ModularIndexing(xindex, 5, 4)
        + sizes.ModularIndexing(xindex, 1, 5)
    )
    assert sizes.simplify_with_ranges(expr, {xindex: 60}) == xindex


@pytest.mark.parametrize("image_stride", [50176, 60000])
def test_two_low_digits_fold_under_a_higher_one(image_stride):
    # rows of 56 in 4 channels of 56 rows: (x // 56) % 224, never % 4 (resnet's max pool read)
    expr = (
        image_stride * sizes.FloorDiv(xindex, 12544)
        + 224 * sizes.ModularIndexing(xindex, 56, 56)
        + 12544 * sizes.ModularIndexing(xindex, 3136, 4)
    )
    want = (
        224 * sizes.FloorDiv(xindex, 56)  # contiguous images: every digit folds
        if image_stride == 224 * 224
        else image_stride * sizes.FloorDiv(xindex, 12544)
        + 224 * sizes.ModularIndexing(xindex, 56, 224)
    )
    assert sizes.simplify_with_ranges(expr, {xindex: 25088}) == want


def test_strided_digits_stay():
    expr = sizes.FloorDiv(xindex, 4) + 8 * sizes.ModularIndexing(xindex, 1, 4)
    assert sizes.simplify_with_ranges(expr, {xindex: 32}) == expr


def test_low_part_below_the_divisor_drops():
    expr = sizes.FloorDiv(40 * rindex + xindex, 960)
    assert sizes.simplify_with_ranges(expr, {xindex: 40, rindex: 72}) == sizes.FloorDiv(rindex, 24)


def test_quotient_is_what_sympy_simplify_gives() -> None:
    import sympy

    from kiln.loopir import sizes

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    cases = [
        (2 * s0 * 768, 768),
        (s0 * s1 * 64, s1),
        (s0**2 * 12, 4 * s0),
        (3072, 4),
        (s0 * s1 + s1, s0 + 1),
        (6 * s0, 4),
    ]
    for numerator, denominator in cases:
        expected = sympy.simplify(numerator / sympy.sympify(denominator))
        assert sympy.srepr(sizes.quotient(numerator, denominator)) == sympy.srepr(expected)
