import sympy

from kiln.codegen_cpp.lanes import lane_access
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


def test_a_digit_of_a_digit_is_one_contiguous_lane_run():
    # a contiguous (4, 4, 128, 64) buffer read as (16, 128, 64): loopir's index of the view
    view = (
        32768 * FloorDiv(x, 32768)
        + 64 * FloorDiv(ModularIndexing(x, 1, 8192), 64)
        + ModularIndexing(x, 1, 64)
        + 8192 * ModularIndexing(x, 8192, 4)
    )
    assert lane_access(view, x, 16).stride == 1
