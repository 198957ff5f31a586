"""Elementwise lowerings: unary math, binary arithmetic, comparisons, where, clamp, pow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.loopir.errors import Unlowerable
from kiln.loopir.ir.views import TensorBox
from kiln.loopir.lowering.common import Value, make_pointwise, out_dtype, promote, scalar
from kiln.loopir.lowering.registry import overloads, register_lowering
from kiln.loopir.virtualized import ops

__all__: list[str] = []

_FLOAT_UNARY = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos",
    "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf",
    "erfc", "erfinv", "sigmoid", "reciprocal", "lgamma", "digamma",
)  # fmt: skip
_SAME_TYPE_UNARY = ("abs", "neg", "relu", "square", "sign", "bitwise_not")
_ROUNDING = ("floor", "ceil", "trunc", "round")
_BOOL_UNARY = ("isnan", "isinf", "signbit")


def _unary(op_name: str) -> Callable[..., TensorBox]:
    def lower(x: TensorBox) -> TensorBox:
        return make_pointwise(getattr(ops, op_name), [x])

    return lower


for _name in _FLOAT_UNARY + _SAME_TYPE_UNARY:
    register_lowering(*overloads(_name, "default"))(_unary(_name))


def _rounding(op_name: str) -> Callable[..., TensorBox]:
    def lower(x: TensorBox) -> TensorBox:
        if not x.get_dtype().is_floating_point:
            return make_pointwise(lambda v: v, [x])
        return make_pointwise(getattr(ops, op_name), [x])

    return lower


for _name in _ROUNDING:
    register_lowering(*overloads(_name, "default"))(_rounding(_name))


def _bool_unary(op_name: str) -> Callable[..., TensorBox]:
    def lower(x: TensorBox) -> TensorBox:
        return make_pointwise(
            getattr(ops, op_name), [x], math_dtype=x.get_dtype(), fn_dtype=torch.bool
        )

    return lower


for _name in _BOOL_UNARY:
    register_lowering(*overloads(_name, "default"))(_bool_unary(_name))


@register_lowering(*overloads("isfinite", "default"))
def _isfinite(x: TensorBox) -> TensorBox:
    def fn(v: Any) -> Any:
        return ops.logical_not(ops.logical_or(ops.isnan(v), ops.isinf(v)))

    return make_pointwise(fn, [x], math_dtype=x.get_dtype(), fn_dtype=torch.bool)


@register_lowering(*overloads("frac", "default"))
def _frac(x: TensorBox) -> TensorBox:
    return make_pointwise(lambda v: ops.sub(v, ops.trunc(v)), [x])


@register_lowering(*overloads("logical_not", "default"))
def _logical_not(x: TensorBox) -> TensorBox:
    return make_pointwise(ops.logical_not, [x], math_dtype=torch.bool, fn_dtype=torch.bool)


def _logical(op_name: str) -> Callable[..., TensorBox]:
    def lower(a: Value, b: Value) -> TensorBox:
        fn = getattr(ops, op_name)
        return make_pointwise(fn, [a, b], math_dtype=torch.bool, fn_dtype=torch.bool)

    return lower


for _name in ("logical_and", "logical_or", "logical_xor"):
    register_lowering(*overloads(_name, "default"))(_logical(_name))

_CMP = ("eq", "ne", "lt", "le", "gt", "ge")


def _compare(op_name: str) -> Callable[..., TensorBox]:
    def lower(a: Value, b: Value) -> TensorBox:
        fn = getattr(ops, op_name)
        return make_pointwise(fn, [a, b], math_dtype=promote(a, b), fn_dtype=torch.bool)

    return lower


for _name in _CMP:
    register_lowering(*overloads(_name, "Tensor", "Scalar"))(_compare(_name))

_SIMPLE_BINARY = {
    "mul": ("mul", ("Tensor", "Scalar")),
    "maximum": ("maximum", ("default",)),
    "minimum": ("minimum", ("default",)),
    "atan2": ("atan2", ("default",)),
    "hypot": ("hypot", ("default",)),
    "copysign": ("copysign", ("Tensor", "Scalar")),
    "nextafter": ("nextafter", ("default",)),
    "fmod": ("fmod", ("Tensor", "Scalar")),
    "remainder": ("mod", ("Tensor", "Scalar", "Scalar_Tensor")),
    "floor_divide": ("floordiv", ("default", "Scalar")),
    "true_divide": ("truediv", ("Tensor", "Scalar")),
    "bitwise_and": ("bitwise_and", ("Tensor", "Scalar", "Scalar_Tensor")),
    "bitwise_or": ("bitwise_or", ("Tensor", "Scalar", "Scalar_Tensor")),
    "bitwise_xor": ("bitwise_xor", ("Tensor", "Scalar", "Scalar_Tensor")),
    "bitwise_left_shift": ("bitwise_left_shift", ("Tensor", "Tensor_Scalar", "Scalar_Tensor")),
    "bitwise_right_shift": ("bitwise_right_shift", ("Tensor", "Tensor_Scalar", "Scalar_Tensor")),
    "pow": ("pow", ("Tensor_Tensor", "Scalar")),
}


def _binary(op_name: str) -> Callable[..., TensorBox]:
    def lower(a: Value, b: Value) -> TensorBox:
        return make_pointwise(getattr(ops, op_name), [a, b])

    return lower


for _aten, (_op, _ovls) in _SIMPLE_BINARY.items():
    register_lowering(*overloads(_aten, *_ovls))(_binary(_op))


# Exponents ATen's pow kernels compute without a general power (exp and log per element),
# and so does loopir: the tanh form of GELU takes x ** 3.0, which a general power would
# compute with a libdevice pow per element.
_POWERS: dict[float, Callable[[Any], Any]] = {
    2: lambda x: ops.mul(x, x),
    3: lambda x: ops.mul(ops.mul(x, x), x),
    0.5: ops.sqrt,
    -0.5: ops.rsqrt,
    -1: ops.reciprocal,
    -2: lambda x: ops.reciprocal(ops.mul(x, x)),
}


@register_lowering(*overloads("pow", "Tensor_Scalar"))
def _pow_scalar(a: Value, b: Any) -> TensorBox:
    floating = isinstance(a, TensorBox) and a.get_dtype().is_floating_point
    if floating and isinstance(b, (int, float)) and not isinstance(b, bool) and b in _POWERS:
        return make_pointwise(_POWERS[b], [a])
    return make_pointwise(ops.pow, [a, b])


def _scaled(b: Value, alpha: Any) -> tuple[Value, bool]:
    if alpha is None or alpha == 1:
        return b, False
    if not isinstance(b, TensorBox):
        return b * alpha, False
    return b, True


@register_lowering(*overloads("add", "Tensor", "Scalar"))
def _add(a: Value, b: Value, alpha: Any = 1) -> TensorBox:
    b, scale = _scaled(b, alpha)
    if scale:
        dt = out_dtype()
        return make_pointwise(lambda x, y: ops.add(x, ops.mul(y, scalar(alpha, _m(dt)))), [a, b])
    return make_pointwise(ops.add, [a, b])


@register_lowering(*overloads("sub", "Tensor", "Scalar"))
def _sub(a: Value, b: Value, alpha: Any = 1) -> TensorBox:
    b, scale = _scaled(b, alpha)
    if scale:
        dt = out_dtype()
        return make_pointwise(lambda x, y: ops.sub(x, ops.mul(y, scalar(alpha, _m(dt)))), [a, b])
    return make_pointwise(ops.sub, [a, b])


def _m(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _trunc_div(x: Any, y: Any, dtype: torch.dtype) -> Any:
    if dtype.is_floating_point:
        return ops.trunc(ops.truediv(x, y))
    q = ops.floordiv(x, y)
    zero = ops.constant(0, dtype)
    inexact = ops.ne(ops.mod(x, y), zero)
    signs_differ = ops.ne(ops.lt(x, zero), ops.lt(y, zero))
    fix = ops.logical_and(inexact, signs_differ)
    return ops.where(fix, ops.add(q, ops.constant(1, dtype)), q)


@register_lowering(*overloads("div", "Tensor", "Scalar", "Tensor_mode", "Scalar_mode"))
def _div(a: Value, b: Value, rounding_mode: str | None = None) -> TensorBox:
    if rounding_mode is None:
        return make_pointwise(ops.truediv, [a, b])
    if rounding_mode == "floor":
        return make_pointwise(ops.floordiv, [a, b])
    result = out_dtype()
    dt = _m(result)

    def fn(x: Any, y: Any) -> Any:
        if result != dt:  # eager rounds the half-precision quotient before truncating
            q = ops.to_dtype(ops.to_dtype(ops.truediv(x, y), result, dt), dt, result)
            return ops.trunc(q)
        return _trunc_div(x, y, dt)

    return make_pointwise(fn, [a, b])


@register_lowering(*overloads("where", "self", "ScalarOther", "ScalarSelf", "Scalar"))
def _where(cond: TensorBox, a: Value, b: Value) -> TensorBox:
    dt = _m(out_dtype())

    def fn(c: Any, x: Any, y: Any) -> Any:
        return ops.where(ops.to_dtype(c, torch.bool, dt), x, y)

    return make_pointwise(fn, [cond, a, b])


@register_lowering(*overloads("clamp", "default", "Tensor"))
def _clamp(x: TensorBox, min: Value | None = None, max: Value | None = None) -> TensorBox:
    if min is None and max is None:
        raise Unlowerable("clamp needs min or max")
    inputs: list[Value] = [x]
    inputs += [v for v in (min, max) if v is not None]

    def fn(v: Any, *bounds: Any) -> Any:
        rest = list(bounds)
        if min is not None:
            v = ops.maximum(v, rest.pop(0))
        if max is not None:
            v = ops.minimum(v, rest.pop(0))
        return v

    return make_pointwise(fn, inputs)


@register_lowering(*overloads("clamp_min", "default", "Tensor"))
def _clamp_min(x: TensorBox, min: Value) -> TensorBox:
    return make_pointwise(ops.maximum, [x, min])


@register_lowering(*overloads("clamp_max", "default", "Tensor"))
def _clamp_max(x: TensorBox, max: Value) -> TensorBox:
    return make_pointwise(ops.minimum, [x, max])


@register_lowering(*overloads("masked_fill", "Scalar", "Tensor"))
def _masked_fill(x: TensorBox, mask: TensorBox, value: Value) -> TensorBox:
    dt = _m(out_dtype())

    def fn(v: Any, m: Any, fill: Any) -> Any:
        return ops.where(ops.to_dtype(m, torch.bool, dt), fill, v)

    return make_pointwise(fn, [x, mask, value])


@register_lowering(*overloads("lerp", "Scalar", "Tensor"))
def _lerp(a: TensorBox, b: TensorBox, weight: Value) -> TensorBox:
    return make_pointwise(lambda x, y, w: ops.add(x, ops.mul(w, ops.sub(y, x))), [a, b, weight])


@register_lowering(*overloads("hardtanh", "default"))
def _hardtanh(x: TensorBox, min_val: float = -1.0, max_val: float = 1.0) -> TensorBox:
    dt = _m(out_dtype())

    def fn(v: Any) -> Any:
        return ops.minimum(ops.maximum(v, scalar(min_val, dt)), scalar(max_val, dt))

    return make_pointwise(fn, [x])
