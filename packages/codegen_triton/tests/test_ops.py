"""Every op of loopir's ``ops`` protocol in a Triton kernel, against the reference backend."""

from __future__ import annotations

import pytest
import torch
from triton_corpus import Case, group, inp, pointwise, random_tensor, run_case

from kiln.loopir.ops import BINARY_OPS, BOOL_RESULT_OPS, UNARY_OPS
from kiln.loopir.virtualized import ops

N = 37  # a ragged tail for the mask
F32, F64, I64, I32 = torch.float32, torch.float64, torch.int64, torch.int32

_DOMAIN = {
    "log": "positive", "log2": "positive", "log10": "positive", "sqrt": "positive",
    "rsqrt": "positive", "lgamma": "positive", "digamma": "positive", "log1p": "positive",
    "reciprocal": "positive", "asin": "unit", "acos": "unit", "atanh": "unit", "erfinv": "unit",
    "acosh": "above_one",
}  # fmt: skip
_INT_UNARY = ("abs", "neg", "sign", "square", "bitwise_not", "relu", "floor", "ceil", "trunc",
              "round", "logical_not", "isnan", "isinf", "signbit")  # fmt: skip
_INT_BINARY = (
    "add", "sub", "mul", "floordiv", "mod", "fmod", "maximum", "minimum", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "eq", "ne", "lt",
    "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "pow",
)  # fmt: skip
# transcendental functions differ from torch's CPU versions in the last bits
_LOOSE = {"lgamma": 1e-4, "digamma": 1e-4, "erfinv": 1e-5, "tan": 1e-5, "pow": 1e-5}


def _unary_case(name: str, dtype: torch.dtype) -> Case:
    out_dtype = torch.bool if name in BOOL_RESULT_OPS else dtype
    x = inp("x", dtype, [N])
    load = x.make_loader()
    out = pointwise("buf0", out_dtype, [N], lambda i: getattr(ops, name)(load(i)))
    kind = "int" if not dtype.is_floating_point else _DOMAIN.get(name, "normal")
    tol = _LOOSE.get(name)
    return Case(f"{name}-{dtype}", group(f"u_{name}", [x], [(out, "x")], N),
                lambda: [random_tensor(dtype, [N], kind)], tol, tol)  # fmt: skip


def _binary_case(name: str, dtype: torch.dtype) -> Case:
    out_dtype = torch.bool if name in BOOL_RESULT_OPS else dtype
    a, b = inp("a", dtype, [N]), inp("b", dtype, [N])
    la, lb = a.make_loader(), b.make_loader()
    out = pointwise("buf0", out_dtype, [N], lambda i: getattr(ops, name)(la(i), lb(i)))
    floating = dtype.is_floating_point
    kind_a = "positive" if name == "pow" and floating else ("int" if not floating else "normal")
    kind_b = "shift" if "shift" in name or (name == "pow" and not floating) else kind_a
    tol = _LOOSE.get(name)

    def make() -> list[torch.Tensor]:
        xa, xb = random_tensor(dtype, [N], kind_a), random_tensor(dtype, [N], kind_b)
        if name in ("eq", "ne", "le", "ge"):
            xb[::3] = xa[::3]  # exercise equality
        return [xa, xb]

    return Case(f"{name}-{dtype}", group(f"b_{name}", [a, b], [(out, "x")], N), make, tol, tol)


_FLOAT_UNARY = [n for n in UNARY_OPS if n != "bitwise_not"]
_FLOAT_BINARY = [n for n in BINARY_OPS if not n.startswith("bitwise")]


@pytest.mark.parametrize("name", _FLOAT_UNARY)
def test_unary_float32(name):
    run_case(_unary_case(name, F32))


@pytest.mark.parametrize("name", _INT_UNARY)
def test_unary_int64(name):
    run_case(_unary_case(name, I64))


@pytest.mark.parametrize("name", _FLOAT_BINARY)
def test_binary_float32(name):
    run_case(_binary_case(name, F32))


@pytest.mark.parametrize("name", _INT_BINARY)
def test_binary_int64(name):
    run_case(_binary_case(name, I64))


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "log1p", "erf", "round"])
def test_unary_float64(name):
    run_case(_unary_case(name, F64))


@pytest.mark.parametrize("name", ["add", "floordiv", "mod", "bitwise_right_shift"])
def test_binary_int32(name):
    run_case(_binary_case(name, I32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_loads_compute_in_float32(dtype):
    x = inp("x", dtype, [N])
    load = x.make_loader()

    def fn(i):
        return ops.to_dtype(ops.exp(ops.to_dtype(load(i), F32)), dtype)

    out = pointwise("buf0", dtype, [N], fn)
    run_case(Case("half", group("half", [x], [(out, "x")], N), lambda: [random_tensor(dtype, [N])]))


def test_conversions_and_where():
    x = inp("x", F32, [N])
    load = x.make_loader()

    def fn(i):
        v = load(i)
        as_int = ops.to_dtype(ops.mul(v, ops.constant(3.0, F32)), I32)  # truncates
        flag = ops.to_dtype(as_int, torch.bool)
        back = ops.to_dtype(ops.where(flag, as_int, ops.constant(-7, I32)), F32)
        return ops.add(back, ops.constant(float("inf"), F32))

    out = pointwise("buf0", F32, [N], fn)
    run_case(Case("conv", group("conv", [x], [(out, "x")], N), lambda: [random_tensor(F32, [N])]))


def test_sign_of_nan_and_signed_zeros_follows_torch():
    x = inp("x", F32, [N])
    load = x.make_loader()
    out = pointwise("buf0", F32, [N], lambda i: ops.sign(load(i)))
    special = torch.tensor([float("nan"), -float("nan"), 0.0, -0.0, float("inf"), -float("inf")])

    def make() -> list[torch.Tensor]:
        values = random_tensor(F32, [N])
        values[: len(special)] = special  # NaN's sign is 0, as torch.sign's
        return [values]

    run_case(Case("sign_nan", group("sign_nan", [x], [(out, "x")], N), make))
