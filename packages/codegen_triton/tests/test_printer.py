"""Index printing."""

import pytest
import sympy

from kiln.codegen_triton.errors import TritonCodegenError
from kiln.codegen_triton.printer import print_index
from kiln.loopir.kernel import RINDEX, XINDEX
from kiln.loopir.sizes import FloorDiv, ModularIndexing, index_symbol


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
