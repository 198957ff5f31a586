"""Activation functions and their backwards, and other composite elementwise ops,
lowered directly (rather than decomposed) so their IR stays short and readable."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from kiln.loopir.errors import Unlowerable
from kiln.loopir.ir.views import TensorBox
from kiln.loopir.lowering.common import Value, compute_dtype, make_pointwise, out_dtype, scalar
from kiln.loopir.lowering.registry import overloads, register_lowering
from kiln.loopir.virtualized import ops

__all__: list[str] = []


Const = Callable[[float], Any]


def _consts() -> Const:
    """Constants in the math dtype of the op being lowered (read now, used later); a
    symbolic number is read from the kernel's argument (:func:`scalar`)."""
    dtype = compute_dtype(out_dtype())
    return lambda value: scalar(value, dtype)


def _one_minus(c: Const, v: Any) -> Any:
    return ops.sub(c(1.0), v)


@register_lowering(*overloads("gelu", "default"))
def _gelu(x: TensorBox, approximate: str = "none") -> TensorBox:
    c = _consts()

    def fn(v: Any) -> Any:
        if approximate == "tanh":
            cube = ops.mul(ops.mul(v, v), v)
            inner = ops.mul(c(math.sqrt(2 / math.pi)), ops.add(v, ops.mul(c(0.044715), cube)))
            return ops.mul(ops.mul(c(0.5), v), ops.add(c(1.0), ops.tanh(inner)))
        cdf = ops.mul(c(0.5), ops.add(c(1.0), ops.erf(ops.mul(v, c(math.sqrt(0.5))))))
        return ops.mul(v, cdf)

    return make_pointwise(fn, [x])


@register_lowering(*overloads("gelu_backward", "default"))
def _gelu_backward(grad: TensorBox, x: TensorBox, approximate: str = "none") -> TensorBox:
    c = _consts()
    if approximate != "none":
        raise Unlowerable("tanh-approximate gelu_backward goes through its decomposition")

    def fn(g: Any, v: Any) -> Any:
        cdf = ops.mul(c(0.5), ops.add(c(1.0), ops.erf(ops.mul(v, c(math.sqrt(0.5))))))
        pdf = ops.mul(ops.exp(ops.mul(c(-0.5), ops.mul(v, v))), c(1 / math.sqrt(2 * math.pi)))
        return ops.mul(g, ops.add(cdf, ops.mul(v, pdf)))

    return make_pointwise(fn, [grad, x])


@register_lowering(*overloads("silu", "default"))
def _silu(x: TensorBox) -> TensorBox:
    return make_pointwise(lambda v: ops.mul(v, ops.sigmoid(v)), [x])


@register_lowering(*overloads("silu_backward", "default"))
def _silu_backward(grad: TensorBox, x: TensorBox) -> TensorBox:
    c = _consts()

    def fn(g: Any, v: Any) -> Any:
        s = ops.sigmoid(v)
        return ops.mul(ops.mul(g, s), ops.add(c(1.0), ops.mul(v, _one_minus(c, s))))

    return make_pointwise(fn, [grad, x])


@register_lowering(*overloads("sigmoid_backward", "default"))
def _sigmoid_backward(grad: TensorBox, y: TensorBox) -> TensorBox:
    c = _consts()
    return make_pointwise(lambda g, s: ops.mul(ops.mul(g, s), _one_minus(c, s)), [grad, y])


@register_lowering(*overloads("tanh_backward", "default"))
def _tanh_backward(grad: TensorBox, y: TensorBox) -> TensorBox:
    c = _consts()
    return make_pointwise(lambda g, t: ops.mul(g, _one_minus(c, ops.mul(t, t))), [grad, y])


@register_lowering(*overloads("threshold", "default"))
def _threshold(x: TensorBox, threshold: float, value: float) -> TensorBox:
    c = _consts()
    return make_pointwise(lambda v: ops.where(ops.le(v, c(threshold)), c(value), v), [x])


@register_lowering(*overloads("threshold_backward", "default"))
def _threshold_backward(grad: TensorBox, x: TensorBox, threshold: float) -> TensorBox:
    c = _consts()
    math_dtype = compute_dtype(out_dtype())

    def fn(g: Any, v: Any) -> Any:
        return ops.where(ops.le(v, ops.constant(threshold, math_dtype)), c(0.0), g)

    return make_pointwise(fn, [grad, x])


@register_lowering(*overloads("leaky_relu", "default"))
def _leaky_relu(x: TensorBox, negative_slope: float = 0.01) -> TensorBox:
    c = _consts()

    def fn(v: Any) -> Any:
        return ops.where(ops.gt(v, c(0.0)), v, ops.mul(v, c(negative_slope)))

    return make_pointwise(fn, [x])


@register_lowering(*overloads("leaky_relu_backward", "default"))
def _leaky_relu_backward(
    grad: TensorBox, x: TensorBox, negative_slope: float, self_is_result: bool
) -> TensorBox:
    c = _consts()

    def fn(g: Any, v: Any) -> Any:
        return ops.where(ops.gt(v, c(0.0)), g, ops.mul(g, c(negative_slope)))

    return make_pointwise(fn, [grad, x])


def _clamp01(c: Const, v: Any, hi: float) -> Any:
    return ops.minimum(ops.maximum(v, c(0.0)), c(hi))


@register_lowering(*overloads("hardsigmoid", "default"))
def _hardsigmoid(x: TensorBox) -> TensorBox:
    c = _consts()
    return make_pointwise(lambda v: ops.truediv(_clamp01(c, ops.add(v, c(3.0)), 6.0), c(6.0)), [x])


@register_lowering(*overloads("hardswish", "default"))
def _hardswish(x: TensorBox) -> TensorBox:
    c = _consts()

    def fn(v: Any) -> Any:
        return ops.truediv(ops.mul(v, _clamp01(c, ops.add(v, c(3.0)), 6.0)), c(6.0))

    return make_pointwise(fn, [x])


@register_lowering(*overloads("elu", "default"))
def _elu(
    x: TensorBox, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0
) -> TensorBox:
    c = _consts()

    def fn(v: Any) -> Any:
        neg = ops.mul(c(alpha * scale), ops.expm1(ops.mul(v, c(input_scale))))
        return ops.where(ops.gt(v, c(0.0)), ops.mul(v, c(scale)), neg)

    return make_pointwise(fn, [x])


def _softplus_of(c: Const, v: Any, beta: float, threshold: float) -> Any:
    scaled = ops.mul(v, c(beta))
    soft = ops.truediv(ops.log1p(ops.exp(scaled)), c(beta))
    return ops.where(ops.gt(scaled, c(threshold)), v, soft)


@register_lowering(*overloads("softplus", "default"))
def _softplus(x: TensorBox, beta: float = 1.0, threshold: float = 20.0) -> TensorBox:
    c = _consts()
    return make_pointwise(lambda v: _softplus_of(c, v, beta, threshold), [x])


@register_lowering(*overloads("mish", "default"))
def _mish(x: TensorBox) -> TensorBox:
    c = _consts()
    return make_pointwise(lambda v: ops.mul(v, ops.tanh(_softplus_of(c, v, 1.0, 20.0))), [x])


def _logit_clamps(eps: float | None) -> bool:
    """ATen clamps ``logit``'s input to ``[eps, 1 - eps]`` only for ``eps >= 0`` (None is -1)."""
    return eps is not None and not math.isnan(eps) and eps >= 0


@register_lowering(*overloads("logit", "default"))
def _logit(x: TensorBox, eps: float | None = None) -> TensorBox:
    c = _consts()

    def fn(v: Any) -> Any:
        if _logit_clamps(eps):
            assert eps is not None
            # ATen's ``x < lo ? lo : (x > hi ? hi : x)``: past eps = 0.5 the bounds cross, and
            # a clamp (max, then min) would give the other bound.
            lo, hi = c(eps), c(1.0 - eps)
            v = ops.where(ops.lt(v, lo), lo, ops.where(ops.gt(v, hi), hi, v))
        return ops.log(ops.truediv(v, _one_minus(c, v)))

    return make_pointwise(fn, [x])


@register_lowering(*overloads("logit_backward", "default"))
def _logit_backward(grad: TensorBox, x: TensorBox, eps: float | None = None) -> TensorBox:
    c = _consts()
    lo = hi = 0.0
    if _logit_clamps(eps):
        # ATen's bounds are ``eps`` and ``1 - eps`` in the input's dtype: a half-precision
        # input at eps rounded to half is inside them, where it is below eps itself.
        dtype = x.get_dtype()
        low = torch.tensor(eps, dtype=dtype)
        lo, hi = float(low), float(torch.tensor(1.0, dtype=dtype) - low)

    def fn(g: Any, v: Any) -> Any:
        dx = ops.truediv(g, ops.mul(v, _one_minus(c, v)))
        if _logit_clamps(eps):
            outside = ops.logical_or(ops.lt(v, c(lo)), ops.gt(v, c(hi)))
            return ops.where(outside, c(0.0), dx)
        # Unclamped, ATen's gradient is NaN outside [0, 1] whatever the forward gave.
        outside = ops.logical_or(ops.lt(v, c(0.0)), ops.gt(v, c(1.0)))
        return ops.where(outside, c(math.nan), dx)

    return make_pointwise(fn, [grad, x])


@register_lowering(*overloads("nan_to_num", "default"))
def _nan_to_num(
    x: TensorBox, nan: float | None = None, posinf: float | None = None, neginf: float | None = None
) -> TensorBox:
    c = _consts()
    dtype = out_dtype()
    if not dtype.is_floating_point:
        return make_pointwise(lambda v: v, [x])
    info = torch.finfo(dtype)
    hi = info.max if posinf is None else posinf
    lo = info.min if neginf is None else neginf

    def fn(v: Any) -> Any:
        v = ops.where(ops.isnan(v), c(0.0 if nan is None else nan), v)
        v = ops.where(ops.eq(v, c(math.inf)), c(hi), v)
        return ops.where(ops.eq(v, c(-math.inf)), c(lo), v)

    return make_pointwise(fn, [x])


def _nan_aware(pick: str) -> Any:
    def lower(a: Value, b: Value) -> TensorBox:
        def fn(x: Any, y: Any) -> Any:
            both = getattr(ops, pick)(x, y)
            return ops.where(ops.isnan(x), y, ops.where(ops.isnan(y), x, both))

        return make_pointwise(fn, [a, b])

    return lower


register_lowering(*overloads("fmax", "default"))(_nan_aware("maximum"))
register_lowering(*overloads("fmin", "default"))(_nan_aware("minimum"))


def _logaddexp_fn(c: Const, base2: bool) -> Any:
    def fn(a: Any, b: Any) -> Any:
        hi = ops.maximum(a, b)
        gap = ops.neg(ops.abs(ops.sub(a, b)))
        if base2:
            tail = ops.truediv(ops.log1p(ops.exp2(gap)), c(math.log(2.0)))
        else:
            tail = ops.log1p(ops.exp(gap))
        same_inf = ops.logical_and(ops.isinf(a), ops.eq(a, b))
        return ops.where(same_inf, a, ops.add(hi, tail))

    return fn


@register_lowering(*overloads("logaddexp", "default"))
def _logaddexp(a: TensorBox, b: TensorBox) -> TensorBox:
    return make_pointwise(_logaddexp_fn(_consts(), False), [a, b])


@register_lowering(*overloads("logaddexp2", "default"))
def _logaddexp2(a: TensorBox, b: TensorBox) -> TensorBox:
    return make_pointwise(_logaddexp_fn(_consts(), True), [a, b])


@register_lowering(*overloads("heaviside", "default"))
def _heaviside(x: TensorBox, values: TensorBox) -> TensorBox:
    dtype = compute_dtype(out_dtype())

    def fn(v: Any, h: Any) -> Any:
        step = ops.to_dtype(ops.gt(v, ops.constant(0, dtype)), dtype, torch.bool)
        return ops.where(ops.eq(v, ops.constant(0, dtype)), h, step)

    return make_pointwise(fn, [x, values])


@register_lowering(*overloads("xlogy", "Tensor", "Scalar_Self", "Scalar_Other"))
def _xlogy(x: Value, y: Value) -> TensorBox:
    c = _consts()

    def fn(a: Any, b: Any) -> Any:
        product = ops.mul(a, ops.log(b))
        zero = ops.where(ops.eq(a, c(0.0)), c(0.0), product)
        return ops.where(ops.isnan(b), b, zero)

    return make_pointwise(fn, [x, y])


@register_lowering(*overloads("deg2rad", "default"))
def _deg2rad(x: TensorBox) -> TensorBox:
    c = _consts()
    return make_pointwise(lambda v: ops.mul(v, c(math.pi / 180.0)), [x])


@register_lowering(*overloads("rad2deg", "default"))
def _rad2deg(x: TensorBox) -> TensorBox:
    c = _consts()
    return make_pointwise(lambda v: ops.mul(v, c(180.0 / math.pi)), [x])


@register_lowering(*overloads("positive", "default"))
def _positive(x: TensorBox) -> TensorBox:
    return x


@register_lowering(*overloads("sgn", "default"))
def _sgn(x: TensorBox) -> TensorBox:
    return make_pointwise(ops.sign, [x])


@register_lowering(*overloads("sinc", "default"))
def _sinc(x: TensorBox) -> TensorBox:
    c = _consts()

    def fn(v: Any) -> Any:
        scaled = ops.mul(v, c(math.pi))
        return ops.where(ops.eq(v, c(0.0)), c(1.0), ops.truediv(ops.sin(scaled), scaled))

    return make_pointwise(fn, [x])


@register_lowering(*overloads("addcmul", "default"))
def _addcmul(x: TensorBox, t1: TensorBox, t2: TensorBox, value: float = 1) -> TensorBox:
    c = _consts()
    return make_pointwise(lambda a, p, q: ops.add(a, ops.mul(c(value), ops.mul(p, q))), [x, t1, t2])


@register_lowering(*overloads("addcdiv", "default"))
def _addcdiv(x: TensorBox, t1: TensorBox, t2: TensorBox, value: float = 1) -> TensorBox:
    c = _consts()
    return make_pointwise(
        lambda a, p, q: ops.add(a, ops.mul(c(value), ops.truediv(p, q))), [x, t1, t2]
    )


@register_lowering(*overloads("rsub", "Tensor", "Scalar"))
def _rsub(x: Value, other: Value, alpha: float = 1) -> TensorBox:
    dtype = compute_dtype(out_dtype())

    def fn(a: Any, b: Any) -> Any:
        scaled = a if alpha == 1 else ops.mul(a, scalar(alpha, dtype))
        return ops.sub(b, scaled)

    return make_pointwise(fn, [x, other])
