import torch

from kiln.codegen_cpp.ops import CannotVectorize, CppOps, CppVar


class Emitter:
    def __init__(self, vectorized):
        self.vectorized = vectorized
        self.lines = []

    def cse(self, expr, dtype):
        var = CppVar(f"t{len(self.lines)}", dtype)
        self.lines.append(f"{var} = {expr}")
        return var


F = CppVar("x", torch.float32)
INT = CppVar("i", torch.int64)
B = CppVar("m", torch.bool)


def test_scalar_printing():
    e = Emitter(False)
    ops = CppOps(e)
    assert ops.exp(F).dtype == torch.float32 and e.lines[-1] == "t0 = std::exp(x)"
    assert ops.lt(F, F).dtype == torch.bool
    ops.floordiv(INT, INT)
    assert "kiln::floordiv<int64_t>(i, i)" in e.lines[-1]
    ops.to_dtype(F, torch.bfloat16)
    assert "kiln::round_to_bf16" in e.lines[-1]
    assert ops.constant(2.5, torch.float32).name == "2.5f"


def test_vector_printing_and_fallbacks():
    e = Emitter(True)
    ops = CppOps(e)
    ops.tanh(F)
    assert e.lines[-1] == "t0 = kiln::tanh(x)"
    ops.lgamma(F)  # no vector form: lanes through the C library
    assert "kiln::map(x" in e.lines[-1] and "std::lgamma" in e.lines[-1]
    ops.where(B, F, F)
    assert "kiln::where(m, x, x)" in e.lines[-1]
    try:
        ops.lt(B, B)
    except CannotVectorize:
        pass
    else:
        raise AssertionError("ordering bools has no vector form")
