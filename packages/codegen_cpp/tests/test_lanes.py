import sympy

from kiln.codegen_cpp.lanes import lane_access, merge_digits
from kiln.loopir.sizes import FloorDiv, ModularIndexing

x = sympy.Symbol("xindex", integer=True, nonnegative=True)
r = sympy.Symbol("rindex", integer=True, nonnegative=True)


def test_affine_indices_have_a_stride():
    assert lane_access(3 * x + 5, x, 16).stride == 3
    assert lane_access(r + 128 * x, r, 16).stride == 1
    assert lane_access(r + 128 * x, x, 16).stride == 128
    assert lane_access(7 * r, x, 16).stride == 0


def test_digits_that_lanes_cannot_cross():
    assert lane_access(ModularIndexing(x, 1, 64), x, 16).stride == 1
    assert lane_access(FloorDiv(x, 32), x, 16).stride == 0
    assert lane_access(ModularIndexing(x, 64, 8), x, 16).stride == 0
    assert lane_access(ModularIndexing(x, 1, 10), x, 16) is None  # rows of 10 split vectors
    assert lane_access(ModularIndexing(x, 2, 64), x, 16) is None


def test_merge_digits_rejoins_flat_indices():
    assert merge_digits(24 * FloorDiv(x, 24) + ModularIndexing(x, 1, 24)) == x
    three = 960 * FloorDiv(x, 960) + 24 * ModularIndexing(x, 24, 40) + ModularIndexing(x, 1, 24)
    assert merge_digits(three) == x
    transposed = FloorDiv(x, 24) + 40 * ModularIndexing(x, 1, 24)
    assert merge_digits(transposed) == transposed
    s = sympy.Symbol("s1", integer=True, positive=True)
    assert merge_digits(s * FloorDiv(x, s) + ModularIndexing(x, 1, s)) == x


def test_merge_digits_sees_through_a_digit_of_a_digit():
    # a contiguous (4, 4, 128, 64) buffer read as (16, 128, 64): loopir's index of the view
    view = (
        32768 * FloorDiv(x, 32768)
        + 64 * FloorDiv(ModularIndexing(x, 1, 8192), 64)
        + ModularIndexing(x, 1, 64)
        + 8192 * ModularIndexing(x, 8192, 4)
    )
    assert merge_digits(view) == x
    assert lane_access(view, x, 16).stride == 1
    assert merge_digits(FloorDiv(ModularIndexing(x, 1, 100), 8)) == FloorDiv(
        ModularIndexing(x, 1, 100), 8
    )
