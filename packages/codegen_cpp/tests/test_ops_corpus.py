"""Every op of loopir's ops protocol through the C++ backend, against the reference backend.

All kernels of this module go into one backend and one build (a few libraries
compiled in parallel), so the whole corpus costs one compile.
"""

from __future__ import annotations

import pytest
import torch

from kiln.codegen_cpp import CppBackend
from kiln.loopir.ops import BINARY_OPS, BOOL_RESULT_OPS, UNARY_OPS
from kiln.loopir.reference import ReferenceBackend
from kiln.loopir.testing import Case, group, inp, outputs_for, pointwise, random_tensor
from kiln.loopir.virtualized import ops

N = 67  # four vectors of 16 and a scalar tail

_DOMAIN = {
    "log": "positive", "log2": "positive", "log10": "positive", "sqrt": "positive",
    "rsqrt": "positive", "lgamma": "positive", "digamma": "positive", "log1p": "positive",
    "reciprocal": "positive", "asin": "unit", "acos": "unit", "atanh": "unit", "erfinv": "unit",
    "acosh": "positive_1",
}  # fmt: skip
_INT_UNARY = (
    "abs",
    "neg",
    "sign",
    "square",
    "bitwise_not",
    "relu",
    "floor",
    "ceil",
    "trunc",
    "round",
    "logical_not",
)
_INT_BINARY = (
    "add", "sub", "mul", "floordiv", "mod", "fmod", "maximum", "minimum", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "eq", "ne", "lt",
    "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "pow",
)  # fmt: skip
_FLOAT_ONLY_BINARY = ("truediv", "atan2", "hypot", "copysign", "nextafter")


def _unary_case(name: str, dtype: torch.dtype) -> Case:
    out_dtype = torch.bool if name in BOOL_RESULT_OPS else dtype
    x = inp("x", dtype, [N])
    load = x.make_loader()
    if dtype in (torch.bfloat16, torch.float16):
        # loopir's convention: half data is computed in float32 and rounded back
        def fn(i):
            value = getattr(ops, name)(ops.to_dtype(load(i), torch.float32))
            return value if out_dtype == torch.bool else ops.to_dtype(value, dtype)
    else:

        def fn(i):
            return getattr(ops, name)(load(i))

    out = pointwise("buf0", out_dtype, [N], fn, origin=name)
    kind = _DOMAIN.get(name, "normal" if dtype.is_floating_point else "int")

    def make():
        if kind == "positive_1":
            return [random_tensor(dtype, [N], "positive") + 1]
        return [random_tensor(dtype, [N], kind)]

    return Case(f"{name}-{dtype}", group(f"k_{name}", [x], [(out, "x")], N), make)


def _binary_case(name: str, dtype: torch.dtype) -> Case:
    out_dtype = torch.bool if name in BOOL_RESULT_OPS else dtype
    a, b = inp("a", dtype, [N]), inp("b", dtype, [N])
    la, lb = a.make_loader(), b.make_loader()
    out = pointwise("buf0", out_dtype, [N], lambda i: getattr(ops, name)(la(i), lb(i)), origin=name)
    if dtype == torch.bool:
        kinds = ("bool", "bool")
    elif name in ("floordiv", "mod", "fmod", "truediv") or (
        name == "pow" and dtype.is_floating_point
    ):
        kinds = (
            "normal" if dtype.is_floating_point else "int",
            "positive" if dtype.is_floating_point else "small_int",
        )
    elif name in ("bitwise_left_shift", "bitwise_right_shift", "pow"):
        kinds = ("int", "small_int")
    else:
        kinds = ("normal", "normal") if dtype.is_floating_point else ("int", "int")

    def make():
        return [random_tensor(dtype, [N], kinds[0]), random_tensor(dtype, [N], kinds[1])]

    return Case(f"{name}-{dtype}", group(f"k_{name}", [a, b], [(out, "x")], N), make)


def _cases() -> list[Case]:
    cases = []
    skip_unary = {"bitwise_not", "logical_not"}
    for dtype in (torch.float32, torch.float64):
        cases += [_unary_case(n, dtype) for n in UNARY_OPS if n not in skip_unary]
        cases += [_binary_case(n, dtype) for n in BINARY_OPS if not n.startswith("bitwise")]
    for dtype in (torch.bfloat16, torch.float16):
        cases += [_unary_case(n, dtype) for n in ("exp", "tanh", "sigmoid", "abs", "isnan", "sqrt")]
    for dtype in (torch.int64, torch.int32):
        cases += [_unary_case(n, dtype) for n in _INT_UNARY]
        cases += [_binary_case(n, dtype) for n in _INT_BINARY]
    cases += [
        _binary_case(n, torch.bool)
        for n in (
            "logical_and",
            "logical_or",
            "logical_xor",
            "eq",
            "ne",
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
        )
    ]
    cases += [_unary_case("logical_not", torch.bool), _unary_case("logical_not", torch.float32)]
    for dtype in (torch.int8, torch.uint8, torch.int16):  # scalar kernels, wrapping arithmetic
        cases += [_binary_case(n, dtype) for n in ("add", "mul", "maximum", "bitwise_and", "lt")]
        cases += [_unary_case(n, dtype) for n in ("neg", "square")]
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> dict[str, object]:
    backend = CppBackend()
    kernels = {case.name: backend.codegen_kernel(case.group).fn for case in CASES}
    backend.finalize()
    return kernels


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_matches_reference(case: Case, built: dict[str, object]) -> None:
    inputs = case.make_inputs()
    ours, ref = outputs_for(case.group), outputs_for(case.group)
    built[case.name](*inputs, *ours)  # type: ignore[operator]
    ReferenceBackend().codegen_kernel(case.group).fn(*inputs, *ref)
    for got, want in zip(ours, ref, strict=True):
        torch.testing.assert_close(got, want, equal_nan=True, atol=case.atol, rtol=case.rtol)
