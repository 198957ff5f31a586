"""The Triton ``ops`` handler: every loopir op printed as a Triton expression.

Values are :class:`CSEVar` s (a temporary's name and its torch dtype); each op
asks the kernel for a temporary through :meth:`TritonKernel.cse`, so equal
expressions are computed once. Memory, index and reduction ops are answered by
the kernel (they depend on masks, loop structure and the store cache); this
module holds the math: Triton's core where it is exact enough, ``libdevice``
where Triton has no op, and ``kh.*`` helpers (``helpers.py``) where a Python
semantic needs spelling out (floor division, remainder, NaN-propagating max).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

import sympy
import torch

from kiln.codegen_triton.errors import TritonCodegenError
from kiln.codegen_triton.mathlib import LIBDEVICE_BINARY, LIBDEVICE_UNARY
from kiln.loopir.ops import BINARY_OPS, BOOL_RESULT_OPS, UNARY_OPS, OpsHandlerBase

__all__ = ["CSEVar", "KernelEmitter", "TritonOps", "triton_type", "literal"]

_TL_TYPES = {
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.int8: "tl.int8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}


def triton_type(dtype: torch.dtype) -> str:
    """The ``tl`` dtype spelling of a torch dtype."""
    try:
        return _TL_TYPES[dtype]
    except KeyError:
        msg = f"Triton kernels do not support dtype {dtype}; keep such ops out of fused kernels"
        raise TritonCodegenError(msg) from None


def literal(value: bool | float, dtype: torch.dtype) -> str:
    """A Python literal Triton reads as ``value`` (infinities and NaN spelled as calls)."""
    if dtype == torch.bool:
        return repr(bool(value))
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return repr(int(value))


@dataclasses.dataclass(frozen=True)
class CSEVar:
    """A named temporary of the kernel and the torch dtype of its value."""

    name: str
    dtype: torch.dtype

    def __str__(self) -> str:
        return self.name


# ops whose Triton spelling is one expression template, for floats and ints alike
_SIMPLE_UNARY = {
    "neg": "-{x}",
    "square": "{x} * {x}",
}
_FLOAT_UNARY = {
    "exp": "tl.exp({x})",
    "exp2": "tl.exp2({x})",
    "log": "tl.log({x})",
    "log2": "tl.log2({x})",
    "sqrt": "tl.sqrt({x})",
    "rsqrt": "tl.rsqrt({x})",
    "sin": "tl.sin({x})",
    "cos": "tl.cos({x})",
    "erf": "tl.erf({x})",
    "floor": "tl.floor({x})",
    "ceil": "tl.ceil({x})",
    "abs": "tl.abs({x})",
    "sigmoid": "tl.sigmoid({x})",
    "reciprocal": "1.0 / {x}",
    "digamma": "kh.digamma({x})",
    "round": "libdevice.rint({x})",
}
_SIMPLE_BINARY = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "truediv": "{a} / {b}",
    "eq": "{a} == {b}",
    "ne": "{a} != {b}",
    "lt": "{a} < {b}",
    "le": "{a} <= {b}",
    "gt": "{a} > {b}",
    "ge": "{a} >= {b}",
    "bitwise_and": "{a} & {b}",
    "bitwise_or": "{a} | {b}",
    "bitwise_xor": "{a} ^ {b}",
    "bitwise_left_shift": "{a} << {b}",
    "bitwise_right_shift": "{a} >> {b}",
}
_FLOAT_BINARY = {
    "maximum": "kh.maximum({a}, {b})",
    "minimum": "kh.minimum({a}, {b})",
    "floordiv": "tl.floor({a} / {b})",
}
_INT_BINARY = {
    "maximum": "tl.maximum({a}, {b})",
    "minimum": "tl.minimum({a}, {b})",
    "floordiv": "kh.int_floordiv({a}, {b})",
    "mod": "kh.int_remainder({a}, {b})",
    "fmod": "kh.int_fmod({a}, {b})",
    "pow": "kh.int_pow({a}, {b})",
}
_IDENTITY_ON_INTS = frozenset({"floor", "ceil", "trunc", "round"})


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


class _Reducer(Protocol):
    def reduce(self, dtype: torch.dtype, rtype: str, value: Any) -> Any: ...


class KernelEmitter(Protocol):
    """What ``ops`` asks of the kernel it prints into (:class:`~.kernel.TritonKernel`).

    Spelled out here so that this module depends on the kernel's contract, not its module.
    """

    @property
    def reductions(self) -> _Reducer: ...

    def cse(self, expr: str, dtype: torch.dtype) -> CSEVar: ...

    def load(self, name: str, index: sympy.Expr) -> CSEVar: ...

    def store(self, name: str, index: sympy.Expr, value: CSEVar, mode: str | None) -> None: ...

    def store_reduction(self, name: str, index: sympy.Expr, value: CSEVar) -> None: ...

    def index_expr(self, index: sympy.Expr, dtype: torch.dtype) -> CSEVar: ...

    def indirect_indexing(self, x: CSEVar, size: sympy.Expr) -> sympy.Symbol: ...

    def masked_body(self, mask: CSEVar, body: Callable[[], Any]) -> CSEVar: ...

    def load_seed(self, name: str, offset: int) -> CSEVar: ...


class TritonOps(OpsHandlerBase[Any]):
    """``ops`` for one :class:`~kiln.codegen_triton.kernel.TritonKernel`."""

    def __init__(self, kernel: KernelEmitter) -> None:
        self.kernel = kernel

    def _cse(self, expr: str, dtype: torch.dtype) -> CSEVar:
        return self.kernel.cse(expr, dtype)

    # -- memory, indices, reductions, randomness: the kernel knows masks and loops --
    def load(self, name: str, index: sympy.Expr) -> CSEVar:
        return self.kernel.load(name, index)

    def store(self, name: str, index: sympy.Expr, value: CSEVar, mode: str | None = None) -> None:
        self.kernel.store(name, index, value, mode)

    def reduction(
        self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any
    ) -> Any:
        return self.kernel.reductions.reduce(dtype, reduction_type, value)

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> None:
        self.kernel.store_reduction(name, index, value)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> CSEVar:
        return self.kernel.index_expr(expr, dtype)

    def indirect_indexing(self, x: CSEVar, size: sympy.Expr, check: bool = True) -> sympy.Symbol:
        return self.kernel.indirect_indexing(x, size)

    def masked(self, mask: CSEVar, body: Callable[[], Any], other: bool | float) -> CSEVar:
        result = self.kernel.masked_body(mask, body)
        fill = self.constant(other, result.dtype)
        return self._cse(f"tl.where({mask}, {result}, {fill})", result.dtype)

    def load_seed(self, name: str, offset: int) -> CSEVar:
        return self.kernel.load_seed(name, offset)

    def rand(self, seed: CSEVar, offset: CSEVar) -> CSEVar:
        return self._cse(f"kh.rand({seed}, {offset})", torch.float32)

    def randn(self, seed: CSEVar, offset: CSEVar) -> CSEVar:
        return self._cse(f"kh.randn({seed}, {offset})", torch.float32)

    # -- values --
    def constant(self, value: bool | float, dtype: torch.dtype) -> CSEVar:
        return self._cse(f"tl.full([1], {literal(value, dtype)}, {triton_type(dtype)})", dtype)

    def to_dtype(
        self, x: CSEVar, dtype: torch.dtype, src_dtype: torch.dtype | None = None
    ) -> CSEVar:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._cse(f"{x} != 0", dtype)
        return self._cse(f"{x}.to({triton_type(dtype)})", dtype)

    def where(self, cond: CSEVar, a: CSEVar, b: CSEVar) -> CSEVar:
        return self._cse(f"tl.where({cond}, {a}, {b})", a.dtype)

    # -- math --
    def __getattr__(self, name: str) -> Callable[..., CSEVar]:
        if name in UNARY_OPS:
            return lambda x: self._unary(name, x)
        if name in BINARY_OPS:
            return lambda a, b: self._binary(name, a, b)
        raise AttributeError(name)

    def _unary(self, name: str, x: CSEVar) -> CSEVar:
        out = torch.bool if name in BOOL_RESULT_OPS else x.dtype
        floating = _is_float(x.dtype)
        if name in _SIMPLE_UNARY:
            expr = _SIMPLE_UNARY[name]
        elif not floating and name in _IDENTITY_ON_INTS:
            return x
        elif name == "abs" and not floating:
            expr = "tl.where({x} < 0, -{x}, {x})"
        elif floating and name in _FLOAT_UNARY:
            expr = _FLOAT_UNARY[name]
        elif floating and name in LIBDEVICE_UNARY and name != "signbit":
            expr = f"libdevice.{name}({{x}})"
        else:
            expr = self._special_unary(name, x)
        return self._cse(expr.format(x=x), out)

    def _special_unary(self, name: str, x: CSEVar) -> str:
        floating = _is_float(x.dtype)
        if name == "relu":
            return "tl.where({x} < 0, tl.zeros_like({x}), {x})"
        if name == "sign":  # 0 for NaN (both comparisons are false), as torch.sign
            ty = triton_type(x.dtype)
            return f"({{x}} > 0).to({ty}) - ({{x}} < 0).to({ty})"
        if name == "isnan":
            return "{x} != {x}"
        if name == "isinf":
            return 'tl.abs({x}) == float("inf")' if floating else "{x} != {x}"
        if name == "signbit":
            return "libdevice.signbit({x}) != 0" if floating else "{x} < 0"
        if name == "logical_not":
            return "{x} == 0"
        if name == "bitwise_not":
            return "{x} == 0" if x.dtype == torch.bool else "~{x}"
        msg = f"Triton backend has no {name} for dtype {x.dtype}"
        raise TritonCodegenError(msg)

    def _binary(self, name: str, a: CSEVar, b: CSEVar) -> CSEVar:
        out = torch.bool if name in BOOL_RESULT_OPS else a.dtype
        floating = _is_float(a.dtype)
        if name in ("logical_and", "logical_or", "logical_xor"):
            op = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}[name]
            return self._cse(f"({a} != 0) {op} ({b} != 0)", torch.bool)
        if floating and name == "mod":
            r = self._cse(f"libdevice.fmod({a}, {b})", a.dtype)
            return self._cse(
                f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})", out
            )
        if a.dtype == torch.bool and name in ("maximum", "minimum"):
            expr = "{a} | {b}" if name == "maximum" else "{a} & {b}"
        elif name in _SIMPLE_BINARY:
            expr = _SIMPLE_BINARY[name]
        elif floating and name in _FLOAT_BINARY:
            expr = _FLOAT_BINARY[name]
        elif floating and name in LIBDEVICE_BINARY:
            expr = f"libdevice.{name}({{a}}, {{b}})"
        elif not floating and name in _INT_BINARY:
            expr = _INT_BINARY[name]
        else:
            msg = f"Triton backend has no {name} for dtype {a.dtype}"
            raise TritonCodegenError(msg)
        return self._cse(expr.format(a=a, b=b), out)
