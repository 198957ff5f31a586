"""The ``ops`` handler protocol: the vocabulary every kernel body is written in.

IR computations are Python functions over sympy index symbols that call the
virtualized ``ops`` namespace (``kiln.loopir.virtualized.ops``). Swapping the
handler behind it gives analysis (reads/writes), printing (IR dumps), reference
evaluation (torch tensors) or code generation (strings of C++ or Triton). A code
generator mostly implements an :class:`OpsHandler` whose values are printed
expressions, plus a kernel template (see :mod:`kiln.loopir.backend`).

Value semantics every handler must follow:

* Values are opaque (``T``): a string, a tensor, a CSE variable. Each has a dtype the
  handler can track: ``load`` gives the buffer's dtype (``KernelGroup.buffers``),
  ``constant``/``index_expr``/``to_dtype`` name theirs, comparisons, ``isnan``,
  ``isinf``, ``signbit`` and ``logical_*`` give ``torch.bool``, ``rand``/``randn`` give
  ``torch.float32``, every other op keeps its operands' dtype.
* Lowerings insert ``to_dtype`` so both operands of a binary op have the same dtype
  (shifts included). Float16/bfloat16 data is converted to float32 before arithmetic
  and back right before ``store``; only data movement (a load stored as is, ``where``,
  ``masked``, ``to_dtype``) may see half values.
* ``truediv`` only sees floating operands. ``floordiv`` floors (``torch.floor_divide``),
  ``mod`` takes the divisor's sign (``torch.remainder``), ``fmod`` the dividend's
  (C ``fmod``). ``maximum``/``minimum`` propagate NaN. ``round`` is half-to-even.
  ``sign`` keeps the dtype and is 0 for NaN (``torch.sign``). ``truediv``/``mod`` by an
  integer zero are undefined.
* Index expressions are sympy integer expressions over the kernel's index symbols,
  built from ``+``, ``*``, integer constants, :class:`kiln.loopir.sizes.FloorDiv`,
  :class:`kiln.loopir.sizes.ModularIndexing` and the symbols returned by
  ``indirect_indexing``. They are positions in the buffer's *storage* (strides and
  offset already applied), in elements.

Reductions (``REDUCTION_TYPES``): ``reduction`` is called inside the reduction loop
with one element; it returns a handle to the finished result, which is only ever
passed to ``store_reduction`` (called once, after the loop, with an index free of
reduction symbols). ``argmax``/``argmin`` take a pair ``(value, index)`` where index is
an int64 ``index_expr`` of the flat reduction position, and give the index.
``welford_reduce`` takes one value and gives ``(mean, m2, weight)``; a Reduction node
names which of the three it stores (duplicated work a codegen may CSE away).

Randomness is counter-based and device independent (:mod:`kiln.loopir.random_bits`):
``load_seed(name, i)`` reads the ``i``-th int64 seed of a seeds buffer the wrapper
fills; ``rand(seed, offset)``/``randn(seed, offset)`` with an int64 offset hash to
the same numbers on every device. Handlers implement them with the published
hash (``kiln_hash32``) so results match the reference backend bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import sympy
import torch

__all__ = [
    "T",
    "UNARY_OPS",
    "BINARY_OPS",
    "BOOL_RESULT_OPS",
    "REDUCTION_TYPES",
    "STORE_MODES",
    "OpsHandler",
    "OpsHandlerBase",
]

T = TypeVar("T")

UNARY_OPS: tuple[str, ...] = (
    "abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "erf", "erfc", "erfinv", "sigmoid", "relu", "floor", "ceil", "trunc", "round",
    "sign", "signbit", "reciprocal", "square", "lgamma", "digamma", "isnan", "isinf",
    "logical_not", "bitwise_not",
)  # fmt: skip
"""Elementwise ops of one operand: ``handler.<name>(x)``."""

BINARY_OPS: tuple[str, ...] = (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "fmod", "pow", "maximum", "minimum",
    "atan2", "hypot", "copysign", "nextafter", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    "eq", "ne", "lt", "le", "gt", "ge",
)  # fmt: skip
"""Elementwise ops of two operands of one dtype: ``handler.<name>(a, b)``."""

BOOL_RESULT_OPS: frozenset[str] = frozenset(
    {"eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "signbit"}
    | {"logical_not", "logical_and", "logical_or", "logical_xor"}
)

REDUCTION_TYPES: tuple[str, ...] = (
    "sum", "prod", "max", "min", "argmax", "argmin", "any", "xor_sum", "welford_reduce",
)  # fmt: skip

STORE_MODES: tuple[str | None, ...] = (None, "atomic_add")
"""``store`` modes: plain write, or accumulate (scatter_add/index_put with accumulate)."""


class OpsHandler(Protocol[T]):
    """What a handler behind ``ops`` provides. Structural: any class with these methods."""

    # -- memory ---------------------------------------------------------------
    def load(self, name: str, index: sympy.Expr) -> T:
        """Read buffer ``name`` at storage position ``index``."""

    def store(self, name: str, index: sympy.Expr, value: T, mode: str | None = None) -> None:
        """Write (or with ``mode='atomic_add'`` accumulate) ``value`` into ``name``."""

    def reduction(
        self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any
    ) -> Any:
        """Fold ``value`` into an accumulator of ``reduction_type``; result in ``dtype``."""

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> None:
        """Write a finished reduction (from :meth:`reduction`) into ``name``."""

    # -- indices and control --------------------------------------------------
    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> T:
        """The value of an index expression as a ``dtype`` (int64 or int32) value."""

    def indirect_indexing(self, x: T, size: sympy.Expr, check: bool = True) -> sympy.Symbol:
        """A fresh index symbol bound to integer value ``x`` (negative wraps by ``size``)."""

    def masked(self, mask: T, body: Callable[[], T], other: bool | float) -> T:
        """``body()`` where ``mask`` holds, ``other`` elsewhere; loads in body must not fault."""

    def where(self, cond: T, a: T, b: T) -> T:
        """Elementwise select; ``a`` and ``b`` share a dtype."""

    def to_dtype(self, x: T, dtype: torch.dtype, src_dtype: torch.dtype | None = None) -> T:
        """Convert with C semantics (float→int truncates; →bool is ``!= 0``)."""

    def constant(self, value: bool | float, dtype: torch.dtype) -> T:
        """A scalar (``inf``/``-inf``/``nan`` allowed for floating dtypes)."""

    # -- randomness -----------------------------------------------------------
    def load_seed(self, name: str, offset: int) -> T:
        """The ``offset``-th int64 seed of seeds buffer ``name``."""

    def rand(self, seed: T, offset: T) -> T:
        """Uniform float32 in [0, 1) from ``kiln_hash32`` (see ``random_bits``)."""

    def randn(self, seed: T, offset: T) -> T:
        """Standard normal float32 via Box-Muller over two ``kiln_hash32`` streams."""

    def __getattr__(self, name: str) -> Callable[..., T]:
        """The elementwise math of ``UNARY_OPS`` and ``BINARY_OPS``."""


class OpsHandlerBase(Generic[T]):
    """A base for handlers: a few derived ops written with primitive ones.

    Only ops whose derivation needs no constant (whose dtype a base class cannot
    know) live here: ``rsqrt``, ``square``, ``logical_xor``.
    """

    def rsqrt(self, x: T) -> T:
        return self.reciprocal(self.sqrt(x))  # type: ignore[attr-defined]

    def square(self, x: T) -> T:
        return self.mul(x, x)  # type: ignore[attr-defined]

    def logical_xor(self, a: T, b: T) -> T:
        return self.ne(a, b)  # type: ignore[attr-defined]
