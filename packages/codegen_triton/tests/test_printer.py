"""Index simplification and printing."""

import pytest
import sympy

from kiln.codegen_triton.errors import TritonCodegenError
from kiln.codegen_triton.printer import print_index, simplify_index
from kiln.loopir.kernel import RINDEX, XINDEX
from kiln.loopir.sizes import FloorDiv, ModularIndexing, index_symbol


def test_contiguous_digits_fold_back_to_the_flat_index():
    expr = 8 * FloorDiv(XINDEX, 8) + ModularIndexing(XINDEX, 1, 8)
    assert simplify_index(expr, {XINDEX: 32}) == XINDEX


def test_three_digits_fold():
    expr = (
        20 * FloorDiv(XINDEX, 20)
        + 5 * ModularIndexing(XINDEX, 5, 4)
        + ModularIndexing(XINDEX, 1, 5)
    )
    assert simplify_index(expr, {XINDEX: 60}) == XINDEX


@pytest.mark.parametrize("image_stride", [50176, 60000])
def test_two_low_digits_fold_under_a_higher_one(image_stride):
    # rows of 56 in 4 channels of 56 rows: (x // 56) % 224, never % 4 (resnet's max pool read)
    expr = (
        image_stride * FloorDiv(XINDEX, 12544)
        + 224 * ModularIndexing(XINDEX, 56, 56)
        + 12544 * ModularIndexing(XINDEX, 3136, 4)
    )
    want = (
        224 * FloorDiv(XINDEX, 56)  # contiguous images: every digit folds
        if image_stride == 224 * 224
        else image_stride * FloorDiv(XINDEX, 12544) + 224 * ModularIndexing(XINDEX, 56, 224)
    )
    assert simplify_index(expr, {XINDEX: 25088}) == want


def test_strided_digits_stay():
    expr = FloorDiv(XINDEX, 4) + 8 * ModularIndexing(XINDEX, 1, 4)
    assert simplify_index(expr, {XINDEX: 32}) == expr


def test_low_part_below_the_divisor_drops():
    expr = FloorDiv(40 * RINDEX + XINDEX, 960)
    assert simplify_index(expr, {XINDEX: 40, RINDEX: 72}) == FloorDiv(RINDEX, 24)


def test_printing():
    ind = index_symbol("indirect", 0)
    assert print_index(XINDEX + 8 * RINDEX) == "8*rindex + xindex"
    assert print_index(ModularIndexing(XINDEX, 4, 8)) == "((xindex // 4) % 8)"
    assert print_index(ModularIndexing(XINDEX, 1, 8)) == "(xindex % 8)"
    assert print_index(FloorDiv(XINDEX + 3, 8)) == "((xindex + 3) // 8)"
    assert print_index(ind * 16 + XINDEX - 2) == "16*indirect0 + xindex - 2"
    assert print_index(sympy.Integer(7)) == "7"


def test_unprintable_index_is_a_codegen_error():
    with pytest.raises(TritonCodegenError):
        print_index(sympy.sin(XINDEX))
