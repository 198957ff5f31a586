"""Index printing."""

import operator
import types

import pytest
import sympy
import torch
from triton_corpus import Case, group, inp, pointwise, random_tensor, run_case

from kiln.codegen_triton.errors import TritonCodegenError
from kiln.codegen_triton.printer import print_index
from kiln.loopir.kernel import RINDEX, XINDEX
from kiln.loopir.sizes import FloorDiv, ModularIndexing, index_symbol
from kiln.loopir.testing import eval_index
from kiln.loopir.virtualized import ops

F32 = torch.float32


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


def _eval_triton(text: str, env: dict[str, int]) -> int:
    """Printed Triton index arithmetic evaluated as Triton does: integer ``//`` and ``%``
    truncate toward zero; ``kh.int_floordiv``/``kh.int_remainder`` floor."""
    names = {
        "tl": types.SimpleNamespace(minimum=min, maximum=max),
        "kh": types.SimpleNamespace(int_floordiv=operator.floordiv, int_remainder=operator.mod),
    }
    return eval_index(text, env, names, truncating=True)


def test_operands_of_unknown_sign_floor():
    i = sympy.Symbol("i", integer=True)
    assert print_index(FloorDiv(XINDEX - 3, 4)) == "kh.int_floordiv(xindex - 3, 4)"
    assert print_index(sympy.Mod(i, 3)) == "kh.int_remainder(i, 3)"
    cases = [
        FloorDiv(XINDEX - 3, 4),
        ModularIndexing(XINDEX - 5, 2, 3),
        ModularIndexing(2 * XINDEX - i, 2, 8),
        sympy.Mod(i, 3),
        sympy.floor((i + XINDEX) / 2),
    ]
    for expr in cases:
        text = print_index(expr)
        for vx, vi in ((0, -7), (1, -1), (2, 0), (9, 5)):
            want = int(expr.xreplace({XINDEX: sympy.Integer(vx), i: sympy.Integer(vi)}))
            assert _eval_triton(text, {"xindex": vx, "i": vi}) == want, (expr, text)


def test_divisions_print_whole():
    s = sympy.Symbol("s", integer=True, positive=True)
    assert print_index(FloorDiv(XINDEX, 2 * s)) == "(xindex // (2*s))"
    assert print_index(XINDEX / 2) == "(xindex // 2)"  # never a truncated coefficient
    assert print_index(sympy.floor(XINDEX / 2 + RINDEX / 2)) == "((rindex + xindex) // 2)"
    with pytest.raises(TritonCodegenError):
        print_index(0.5 * XINDEX)


def test_kernel_indexed_by_signed_divisions_matches_the_reference():
    # xindex - 3 and xindex - 5 are negative on the first lanes: Triton's // and % truncate there
    a, b = inp("a", F32, [17]), inp("b", F32, [8])
    la, lb = a.make_loader(), b.make_loader()

    def body(i):
        return ops.add(la([FloorDiv(i[0] - 3, 4) + 1]), lb([ModularIndexing(i[0] - 5, 1, 8)]))

    g = group("k", [a, b], [(pointwise("buf0", F32, [64], body), "x")], 64)
    run_case(Case("signed", g, lambda: [random_tensor(F32, [17]), random_tensor(F32, [8])]))
