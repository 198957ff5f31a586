"""Helpers every lowering family shares: broadcasting, dtype promotion, pointwise builders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import symbolic
from kiln.loopir.errors import StaticShapesOnly
from kiln.loopir.ir.loops import Pointwise
from kiln.loopir.ir.views import TensorBox, View
from kiln.loopir.virtualized import V, ops

__all__ = [
    "Value",
    "out_meta",
    "out_dtype",
    "is_half",
    "compute_dtype",
    "broadcast_sizes",
    "expand_to",
    "loader_for",
    "make_pointwise",
    "promote",
    "scalar",
    "canonical_dim",
    "origin",
]

Value = TensorBox | bool | int | float


def out_meta() -> Any:
    """The meta value of the op being lowered (shape, dtype, strides of its result)."""
    return V.graph.current_meta


def origin() -> str:
    """A name for the op being lowered, printed in IR dumps and kernels."""
    return str(V.graph.current_op)


def out_dtype(index: int = 0) -> torch.dtype:
    meta = out_meta()
    if isinstance(meta, (tuple, list)):
        meta = meta[index]
    return meta.dtype  # type: ignore[no-any-return]


def is_half(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype math runs in: float32 for half types (as eager's kernels do)."""
    return torch.float32 if is_half(dtype) else dtype


def _meta_of(x: Value) -> Any:
    if isinstance(x, TensorBox):
        shape = [1] * x.dim()
        return torch.empty(shape, dtype=x.get_dtype(), device="meta")
    if isinstance(x, sympy.Expr) and not x.is_Number:  # a symbolic int or float input
        return 1 if x.is_integer else 1.0
    return x


def scalar(value: Any, dtype: torch.dtype) -> Any:
    """``value`` (a Python number, or the expression of a symbolic number input) as a
    ``dtype`` value in a kernel: a symbolic one is read from the kernel's scalar argument
    and converted as eager converts a Python scalar to the op's computation dtype."""
    if isinstance(value, sympy.Expr) and not value.is_Number:
        if dtype == torch.bool:
            msg = f"a symbolic number {value} as a bool"
            raise StaticShapesOnly(msg)
        if value.is_integer:
            return ops.index_expr(value, dtype)
        return ops.to_dtype(_float_math(value), dtype, torch.float64)
    return ops.constant(value, dtype)


def _float_math(expr: sympy.Expr) -> Any:
    """A float expression over symbolic number inputs (``s + 3.5``, ``2.0 / s``) as float64
    ops, as Python computes it before the op converts it: an index expression is integer
    math, which has no ``3.5``."""
    if expr.is_Number:
        return ops.constant(float(expr), torch.float64)
    if isinstance(expr, sympy.Symbol):
        return ops.index_expr(expr, torch.float64)
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        combine = ops.add if isinstance(expr, sympy.Add) else ops.mul
        terms = [_float_math(a) for a in expr.args]
        result = terms[0]
        for term in terms[1:]:
            result = combine(result, term)
        return result
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp != 0:
        base = _float_math(expr.base)
        result = base
        for _ in range(abs(int(expr.exp)) - 1):
            result = ops.mul(result, base)
        if expr.exp < 0:
            return ops.truediv(ops.constant(1.0, torch.float64), result)
        return result
    msg = f"the symbolic number {expr} in a kernel"
    raise StaticShapesOnly(msg)


def promote(*args: Value) -> torch.dtype:
    """torch's type promotion over tensors (0-dim ones weakly) and Python scalars."""
    metas = [_meta_of(a) for a in args if a is not None]
    dtype = metas[0].dtype if isinstance(metas[0], torch.Tensor) else None
    if len(metas) == 1:
        return dtype if dtype is not None else torch.tensor(metas[0]).dtype
    result = torch.result_type(metas[0], metas[1])
    for m in metas[2:]:
        a = torch.empty([1], dtype=result, device="meta")
        result = torch.result_type(a, m)
    return result


def broadcast_sizes(*shapes: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    out: list[sympy.Expr] = []
    for i in range(ndim):
        size: sympy.Expr = sympy.Integer(1)
        for s in shapes:
            j = i - (ndim - len(s))
            if j >= 0 and s[j] != 1:
                size = s[j]
        out.append(size)
    return tuple(out)


BROADCAST_STORE_FACTOR = 64
"""How many times more elements a broadcast must reach before its value may be stored first
(``BackendTraits.broadcast_store_ops``)."""


def expand_to(x: TensorBox, size: Sequence[sympy.Expr]) -> TensorBox:
    """``x`` broadcast to ``size`` as a view (no copy)."""
    size = tuple(size)
    if x.get_size() == size:
        return x
    _store_before_broadcast(x, size)
    xs = x.get_size()
    lead = len(size) - len(xs)

    def reindex(index: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        inner = index[lead:]
        return [sympy.S.Zero if s == 1 else i for i, s in zip(inner, xs, strict=True)]

    return TensorBox(View(x.data, size, reindex, "expand"))


def _store_before_broadcast(x: TensorBox, size: Sequence[sympy.Expr]) -> None:
    """Store the value under ``x``'s views first where the backend asks: it costs more than
    ``broadcast_store_ops`` ops an element, and ``size`` has many times its elements."""
    limit = V.graph.backend_traits(x.get_device()).broadcast_store_ops
    box = x.storage()
    if not limit or box is None or box.is_realized():
        return
    small, big = _numel_hint(box.get_size()), _numel_hint(size)
    if small is None or big is None or big < BROADCAST_STORE_FACTOR * small:
        return
    if box.body_ops() > limit:
        box.realize()


def _numel_hint(size: Sequence[sympy.Expr]) -> int | None:
    """The element count at this call's sizes (a heuristic's input), None where unknown."""
    try:
        return symbolic.hint(sympy.Mul(*size))
    except StaticShapesOnly:
        return None


def loader_for(x: Value, size: Sequence[sympy.Expr], dtype: torch.dtype) -> Callable[..., Any]:
    """A loader producing ``x`` broadcast to ``size`` and converted to ``dtype``."""
    if not isinstance(x, TensorBox):
        value = x
        return lambda index: scalar(value, dtype)
    inner = expand_to(x, size).make_loader()
    src = x.get_dtype()
    if src == dtype:
        return inner
    return lambda index: ops.to_dtype(inner(index), dtype, src)


def make_pointwise(
    fn: Callable[..., Any],
    inputs: Sequence[Value],
    *,
    dtype: torch.dtype | None = None,
    math_dtype: torch.dtype | None = None,
    fn_dtype: torch.dtype | None = None,
    name: str | None = None,
) -> TensorBox:
    """A ``Pointwise`` applying ``fn`` to the broadcast inputs.

    Inputs are converted to ``math_dtype`` (default: the promoted input dtype, or
    the result dtype for ops that produce floats from ints), upcast from half to
    float32; ``fn`` gives ``fn_dtype`` (default: the math dtype; bool for comparisons)
    and its result is converted to ``dtype`` (default: the op's result dtype).
    """
    result = dtype or out_dtype()
    math = compute_dtype(math_dtype or result)
    tensors = [x for x in inputs if isinstance(x, TensorBox)]
    size = broadcast_sizes(*(t.get_size() for t in tensors))
    loaders = [loader_for(x, size, math) for x in inputs]
    device = tensors[0].get_device() if tensors else V.graph.default_device

    def inner(index: Sequence[sympy.Expr]) -> Any:
        value = fn(*[load(index) for load in loaders])
        produced = fn_dtype or math
        return ops.to_dtype(value, result, produced) if produced != result else value

    return TensorBox.from_loops(Pointwise(device, result, size, name or origin(), inner))


def canonical_dim(dim: int, ndim: int) -> int:
    """``dim`` made non-negative (a 0-dim tensor accepts 0 and -1)."""
    if ndim == 0:
        return 0
    return dim % ndim
