"""Lowerings that make values: full/zeros/ones/empty, arange/iota, random, and copies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes
from kiln.loopir.errors import Unlowerable
from kiln.loopir.ir.loops import Pointwise
from kiln.loopir.ir.views import TensorBox
from kiln.loopir.lowering.common import (
    compute_dtype,
    expand_to,
    make_pointwise,
    origin,
    out_meta,
    scalar,
)
from kiln.loopir.lowering.fallback import extern_call
from kiln.loopir.lowering.registry import overloads, register_lowering
from kiln.loopir.virtualized import V, ops

__all__ = ["full", "random_tensor"]


def _target() -> tuple[torch.device, torch.dtype, tuple[sympy.Expr, ...]]:
    meta = out_meta()
    shape = tuple(sizes.sympify(s) for s in meta.shape)
    return V.graph.device_of(meta), meta.dtype, shape


def full(value: Any) -> TensorBox:
    """A tensor of the op's result shape filled with ``value``."""
    device, dtype, shape = _target()
    if isinstance(value, TensorBox):
        raise Unlowerable("full with a tensor fill value")
    return TensorBox.from_loops(
        Pointwise(device, dtype, shape, origin(), lambda idx: scalar(value, dtype))
    )


@register_lowering(*overloads("full", "default"), *overloads("new_full", "default"))
def _full(*args: Any, **kwargs: Any) -> TensorBox:
    value = args[-1] if args else kwargs["fill_value"]
    return full(value)


@register_lowering(*overloads("full_like", "default"))
def _full_like(x: TensorBox, value: Any, **kwargs: Any) -> TensorBox:
    return full(value)


@register_lowering(
    *overloads("zeros", "default"),
    *overloads("zeros_like", "default"),
    *overloads("new_zeros", "default"),
    *overloads("empty", "memory_format"),
    *overloads("empty_like", "default"),
    *overloads("new_empty", "default"),
    *overloads("empty_strided", "default"),
    *overloads("new_empty_strided", "default"),
)
def _zeros(*args: Any, **kwargs: Any) -> TensorBox:
    return full(0)


@register_lowering(
    *overloads("ones", "default"),
    *overloads("ones_like", "default"),
    *overloads("new_ones", "default"),
)
def _ones(*args: Any, **kwargs: Any) -> TensorBox:
    return full(1)


@register_lowering(*overloads("scalar_tensor", "default"))
def _scalar_tensor(value: Any, **kwargs: Any) -> TensorBox:
    return full(value)


@register_lowering(*overloads("arange", "default", "start", "start_step"))
def _arange(*args: Any, **kwargs: Any) -> TensorBox:
    numbers = [a for a in args if isinstance(a, (int, float))]
    start: float = 0
    step: float = 1
    if len(numbers) >= 2:
        start = numbers[0]
    if len(numbers) == 3:
        step = numbers[2]
    start = kwargs.get("start", start)
    step = kwargs.get("step", step)
    device, dtype, shape = _target()
    math = compute_dtype(dtype) if dtype.is_floating_point else torch.int64

    def inner(idx: Sequence[sympy.Expr]) -> Any:
        pos = ops.index_expr(idx[0], torch.int64)
        if math != torch.int64 or not isinstance(start, int) or not isinstance(step, int):
            pos = ops.to_dtype(pos, math, torch.int64)
        value = ops.add(ops.mul(pos, ops.constant(step, math)), ops.constant(start, math))
        return ops.to_dtype(value, dtype, math) if math != dtype else value

    return TensorBox.from_loops(Pointwise(device, dtype, shape, origin(), inner))


def random_tensor(kind: str) -> TensorBox:
    """``rand``/``randn`` values from the seeds buffer and each element's flat index."""
    device, dtype, shape = _target()
    seeds, seed_index = V.graph.next_seed(device)

    def inner(idx: Sequence[sympy.Expr]) -> Any:
        seed = ops.load_seed(seeds, seed_index)
        offset = ops.index_expr(sizes.flat_index(idx, shape), torch.int64)
        value = getattr(ops, kind)(seed, offset)
        return ops.to_dtype(value, dtype, torch.float32) if dtype != torch.float32 else value

    return TensorBox.from_loops(Pointwise(device, dtype, shape, origin(), inner))


@register_lowering(*overloads("rand", "default"), *overloads("rand_like", "default"))
def _rand(*args: Any, **kwargs: Any) -> TensorBox:
    return random_tensor("rand")


@register_lowering(*overloads("randn", "default"), *overloads("randn_like", "default"))
def _randn(*args: Any, **kwargs: Any) -> TensorBox:
    return random_tensor("randn")


@register_lowering(*overloads("bernoulli", "p"))
def _bernoulli(x: TensorBox, p: float = 0.5, **kwargs: Any) -> TensorBox:
    noise = random_tensor("rand")
    return make_pointwise(
        lambda u: ops.lt(u, ops.constant(p, torch.float32)),
        [noise],
        math_dtype=torch.float32,
        fn_dtype=torch.bool,
    )


def _convert(x: TensorBox) -> TensorBox:
    return make_pointwise(lambda v: v, [x], math_dtype=out_meta().dtype)


@register_lowering(*overloads("_to_copy", "default"), *overloads("clone", "default"))
def _to_copy(x: TensorBox, **kwargs: Any) -> TensorBox:
    if V.graph.device_of(out_meta()) != x.get_device():
        # ATen's copy between devices; torch's decomposition of it (prims.device_put) would
        # be run on meta data to find its result's shape, which a device copy refuses
        return extern_call(V.graph.current_op, (x,), kwargs, is_fallback=False)  # type: ignore[no-any-return]
    return _convert(x)


@register_lowering(*overloads("lift_fresh_copy", "default"))
def _lift_fresh_copy(x: TensorBox) -> TensorBox:
    return _convert(x)


@register_lowering(torch.ops.prims.convert_element_type.default)
def _convert_element_type(x: TensorBox, dtype: torch.dtype) -> TensorBox:
    return _convert(x)


@register_lowering(*overloads("copy", "default"))
def _copy(dst: TensorBox, src: TensorBox, non_blocking: bool = False) -> TensorBox:
    return make_pointwise(lambda s: s, [expand_to(src, dst.get_size())], math_dtype=dst.get_dtype())


@register_lowering(torch.ops.prims.iota.default)
def _iota(length: int, *, start: int, step: int, **kwargs: Any) -> TensorBox:
    device, dtype, shape = _target()

    def inner(idx: Sequence[sympy.Expr]) -> Any:
        return ops.index_expr(start + idx[0] * step, dtype)

    return TensorBox.from_loops(Pointwise(device, dtype, shape, origin(), inner))
