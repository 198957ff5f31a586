"""The elementwise half of the C++ ``ops`` handler: each op prints a C++ expression.

Values are :class:`CppVar` (a C++ name and the torch dtype it holds). Every op
renders an expression and hands it to the kernel's common-subexpression
eliminator, which declares a variable for it. One handler class serves both
variants: scalar (plain C++ and the ``std::`` library) and vectorized
(``kiln::Vec``/``kiln::Mask`` from ``kiln_vec.h``); a vectorized op with no
vector form maps the scalar form over lanes. Ops that cannot vectorize raise
:class:`CannotVectorize`, and the kernel falls back to its scalar variant.
Memory and control ops (``load``, ``store``, ``masked``...) live with the kernel.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Protocol

import torch

from kiln.codegen_cpp.dtypes import compute_ctype, vector_ctype
from kiln.codegen_cpp.printer import cpp_float_literal, cpp_int_literal
from kiln.loopir.ops import BINARY_OPS, BOOL_RESULT_OPS, UNARY_OPS, OpsHandlerBase

__all__ = ["CannotVectorize", "CppOps", "CppVar", "Emitter"]


class CannotVectorize(Exception):  # a signal between modules, never seen by users
    """An op of this kernel has no vectorized form; generate the scalar variant."""


@dataclasses.dataclass(frozen=True)
class CppVar:
    """A C++ variable (or literal) holding a value of ``dtype``."""

    name: str
    dtype: torch.dtype

    def __str__(self) -> str:
        return self.name


class Emitter(Protocol):
    """What the handler needs from the kernel being generated."""

    vectorized: bool

    def cse(self, expr: str, dtype: torch.dtype) -> CppVar:
        """Declare (or reuse) a variable holding ``expr``."""
        ...


# Scalar forms; "{x}"/"{a}"/"{b}" are operands, "{T}" the compute type.
_STD_UNARY = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
    "lgamma", "floor", "ceil", "trunc",
)  # fmt: skip
_FLOAT_UNARY: dict[str, str] = {name: f"std::{name}({{x}})" for name in _STD_UNARY} | {
    "round": "std::nearbyint({x})",
    "erfinv": "static_cast<{T}>(kiln::erfinv({x}))",
    "digamma": "static_cast<{T}>(kiln::digamma({x}))",
    "sigmoid": "kiln::sigmoid({x})",
    "reciprocal": "static_cast<{T}>(1) / {x}",
    "rsqrt": "static_cast<{T}>(1) / std::sqrt({x})",
    "isnan": "std::isnan({x})",
    "isinf": "std::isinf({x})",
    "signbit": "std::signbit({x})",
}
_ANY_UNARY: dict[str, str] = {
    "abs": "std::abs({x})",
    "neg": "-{x}",
    "relu": "kiln::relu({x})",
    "sign": "kiln::sign({x})",
    "square": "{x} * {x}",
    "logical_not": "!{x}",
}
_INT_UNARY: dict[str, str] = {
    "floor": "{x}",
    "ceil": "{x}",
    "trunc": "{x}",
    "round": "{x}",
    "isnan": "false",
    "isinf": "false",
    "signbit": "{x} < 0",
    "bitwise_not": "~{x}",
}
_OPERATORS: dict[str, str] = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "bitwise_and": "&", "bitwise_or": "|",
    "bitwise_xor": "^", "bitwise_left_shift": "<<", "bitwise_right_shift": ">>", "eq": "==",
    "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
}  # fmt: skip
_BINARY_CALLS: dict[str, str] = {
    "floordiv": "kiln::floordiv<{T}>({a}, {b})",
    "mod": "kiln::pymod<{T}>({a}, {b})",
    "maximum": "kiln::scalar_max<{T}>({a}, {b})",
    "minimum": "kiln::scalar_min<{T}>({a}, {b})",
    "atan2": "std::atan2({a}, {b})",
    "hypot": "std::hypot({a}, {b})",
    "copysign": "std::copysign({a}, {b})",
    "nextafter": "std::nextafter({a}, {b})",
    "logical_and": "{a} && {b}",
    "logical_or": "{a} || {b}",
    "logical_xor": "static_cast<bool>({a}) != static_cast<bool>({b})",
}
# Vector forms that kiln_vec.h implements for float (everything else maps lanes): op name ->
# kiln_vec.h function.
_VEC_FLOAT_FNS: dict[str, str] = {
    name: name
    for name in ("exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "sqrt", "floor", "ceil", "trunc")
} | {"round": "nearbyint"}  # fmt: skip


_LITERAL = re.compile(r"[0-9.]+(e[-+]?[0-9]+)?f?")


def _paren(text: str) -> str:
    atom = text.replace("_", "").isalnum() or _LITERAL.fullmatch(text) is not None
    return text if atom else f"({text})"


class CppOps(OpsHandlerBase[CppVar]):
    """Prints elementwise ops for ``emitter`` (scalar or vectorized)."""

    def __init__(self, emitter: Emitter) -> None:
        self.emitter = emitter

    @property
    def vectorized(self) -> bool:
        return self.emitter.vectorized

    # -- literals and conversions ---------------------------------------------
    def constant(self, value: bool | float, dtype: torch.dtype) -> CppVar:
        if dtype == torch.bool:
            literal = "true" if value else "false"
            return self.emitter.cse(f"kiln::Mask({literal})" if self.vectorized else literal, dtype)
        ctype = compute_ctype(dtype)
        if dtype.is_floating_point:
            literal = cpp_float_literal(float(value), "double" if ctype == "double" else "float")
        else:
            literal = f"static_cast<{ctype}>({cpp_int_literal(int(value))})"
        if self.vectorized:
            return self.emitter.cse(f"{vector_ctype(dtype)}({literal})", dtype)
        if dtype.is_floating_point and not math.isfinite(float(value)):
            return self.emitter.cse(literal, dtype)
        return CppVar(literal, dtype)

    def to_dtype(
        self, x: CppVar, dtype: torch.dtype, src_dtype: torch.dtype | None = None
    ) -> CppVar:
        src = x.dtype
        if src == dtype:
            return x
        if self.vectorized:
            return self.emitter.cse(self._vector_convert(x, dtype), dtype)
        ctype = compute_ctype(dtype)
        if dtype == torch.bool:
            expr = f"{_paren(x.name)} != 0"
        elif dtype == torch.bfloat16:
            expr = f"kiln::round_to_bf16(static_cast<float>({x}))"
        elif dtype == torch.float16:
            expr = f"kiln::round_to_half(static_cast<float>({x}))"
        elif compute_ctype(src) == ctype:
            return CppVar(x.name, dtype)
        else:
            expr = f"static_cast<{ctype}>({x})"
        return self.emitter.cse(expr, dtype)

    def _vector_convert(self, x: CppVar, dtype: torch.dtype) -> str:
        if dtype == torch.bool:
            return f"kiln::to_bool({x})"
        ctype = compute_ctype(dtype)
        if x.dtype == torch.bool:
            value = f"kiln::cast<{ctype}>({x})"
        elif compute_ctype(x.dtype) == ctype:
            value = x.name
        else:
            value = f"kiln::cast<{ctype}>({x})"
        if dtype == torch.bfloat16:
            return f"kiln::round_to_bf16({value})"
        if dtype == torch.float16:
            return f"kiln::round_to_half({value})"
        return value

    def where(self, cond: CppVar, a: CppVar, b: CppVar) -> CppVar:
        if self.vectorized:
            return self.emitter.cse(f"kiln::where({cond}, {a}, {b})", a.dtype)
        return self.emitter.cse(f"{_paren(cond.name)} ? {a} : {b}", a.dtype)

    # -- elementwise math -----------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., CppVar]:
        if name in UNARY_OPS:
            return lambda x: self._unary(name, x)
        if name in BINARY_OPS:
            return lambda a, b: self._binary(name, a, b)
        raise AttributeError(name)

    def _result_dtype(self, name: str, operand: torch.dtype) -> torch.dtype:
        return torch.bool if name in BOOL_RESULT_OPS else operand

    def _unary(self, name: str, x: CppVar) -> CppVar:
        out = self._result_dtype(name, x.dtype)
        if self.vectorized:
            return self.emitter.cse(self._vector_unary(name, x), out)
        return self.emitter.cse(self._scalar_unary(name, x.name, x.dtype), out)

    def _scalar_unary(self, name: str, x: str, dtype: torch.dtype) -> str:
        if dtype == torch.bool and name in ("bitwise_not", "abs"):
            template = "!{x}" if name == "bitwise_not" else "{x}"
        elif dtype.is_floating_point:
            template = _FLOAT_UNARY.get(name) or _ANY_UNARY[name]
        else:
            template = _INT_UNARY.get(name) or _ANY_UNARY.get(name) or _FLOAT_UNARY[name]
        return template.format(x=_paren(x), T=compute_ctype(dtype))

    def _vector_unary(self, name: str, x: CppVar) -> str:
        dtype = x.dtype
        if dtype == torch.bool:
            if name in ("logical_not", "bitwise_not"):
                return f"!{x}"
            if name == "abs":
                return x.name
            raise CannotVectorize(name)
        ctype = compute_ctype(dtype)
        if name in _VEC_FLOAT_FNS and ctype == "float":
            return f"kiln::{_VEC_FLOAT_FNS[name]}({x})"
        if name == "rsqrt" and ctype == "float":  # as the scalar form: 1 / sqrt, both exact
            return f"{vector_ctype(dtype)}(1) / kiln::sqrt({x})"
        if name == "neg":
            return f"-{x}"
        if name == "abs":
            return f"kiln::abs({x})"
        if name == "square":
            return f"{x} * {x}"
        if name == "relu":
            return f"kiln::where({x} < {vector_ctype(dtype)}(0), {vector_ctype(dtype)}(0), {x})"
        if name == "reciprocal":
            return f"{vector_ctype(dtype)}(1) / {x}"
        if name == "logical_not":
            return f"{x} == {vector_ctype(dtype)}(0)"
        if name in ("isnan", "isinf", "signbit"):
            scalar = self._scalar_unary(name, f"{x}[lane]", dtype)
            return f"kiln::mask_from_lanes([&](int64_t lane) {{ return {scalar}; }})"
        if not dtype.is_floating_point and name in ("floor", "ceil", "trunc", "round"):
            return x.name
        if name == "bitwise_not":
            return f"{vector_ctype(dtype)}(-1) ^ {x}"
        scalar = self._scalar_unary(name, "t", dtype)
        return f"kiln::map({x}, []({ctype} t) {{ return static_cast<{ctype}>({scalar}); }})"

    def _binary(self, name: str, a: CppVar, b: CppVar) -> CppVar:
        dtype = a.dtype
        out = self._result_dtype(name, dtype)
        if self.vectorized:
            return self.emitter.cse(self._vector_binary(name, a, b), out)
        return self.emitter.cse(self._scalar_binary(name, a.name, b.name, dtype), out)

    def _scalar_binary(self, name: str, a: str, b: str, dtype: torch.dtype) -> str:
        ctype = compute_ctype(dtype)
        if name in _OPERATORS:
            return f"{_paren(a)} {_OPERATORS[name]} {_paren(b)}"
        if name == "fmod":
            template = "std::fmod({a}, {b})" if dtype.is_floating_point else "{a} % {b}"
        elif name == "pow":
            template = (
                "std::pow({a}, {b})" if dtype.is_floating_point else "kiln::ipow<{T}>({a}, {b})"
            )
        else:
            template = _BINARY_CALLS[name]
        return template.format(a=_paren(a), b=_paren(b), T=ctype)

    def _vector_binary(self, name: str, a: CppVar, b: CppVar) -> str:
        dtype = a.dtype
        if dtype == torch.bool:
            masks = {"logical_and": "&", "bitwise_and": "&", "logical_or": "|", "bitwise_or": "|"}
            masks |= {"logical_xor": "^", "bitwise_xor": "^", "ne": "^"}
            if name in masks:
                return f"{a} {masks[name]} {b}"
            if name == "eq":
                return f"!({a} ^ {b})"
            raise CannotVectorize(name)
        if name in ("logical_and", "logical_or", "logical_xor"):
            op = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}[name]
            return f"kiln::to_bool({a}) {op} kiln::to_bool({b})"
        if name in _OPERATORS:
            if dtype.is_floating_point and name.startswith("bitwise"):
                raise CannotVectorize(name)
            return f"{a} {_OPERATORS[name]} {b}"
        if name in ("maximum", "minimum"):
            return f"kiln::{name}({a}, {b})"
        ctype = compute_ctype(dtype)
        scalar = self._scalar_binary(name, "p", "q", dtype)
        return (
            f"kiln::map2({a}, {b}, []({ctype} p, {ctype} q) "
            f"{{ return static_cast<{ctype}>({scalar}); }})"
        )

    # -- randomness -----------------------------------------------------------
    def rand(self, seed: CppVar, offset: CppVar) -> CppVar:
        return self._random("rand", seed, offset)

    def randn(self, seed: CppVar, offset: CppVar) -> CppVar:
        return self._random("randn", seed, offset)

    def _random(self, fn: str, seed: CppVar, offset: CppVar) -> CppVar:
        if self.vectorized:
            expr = (
                f"kiln::from_lanes<float>([&](int64_t lane) "
                f"{{ return kiln::{fn}({seed}[lane], {offset}[lane]); }})"
            )
        else:
            expr = f"kiln::{fn}({seed}, {offset})"
        return self.emitter.cse(expr, torch.float32)
