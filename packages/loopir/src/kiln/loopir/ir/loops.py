"""Computations: ``Pointwise``, ``Reduction`` and ``Scatter`` as Python functions over indices.

Each holds an ``inner_fn`` that, called with sympy index expressions under some
``ops`` handler, computes one element by calling ``ops.*``. They are data: frozen,
comparable by identity, printable via :mod:`kiln.loopir.printing`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes
from kiln.loopir.errors import IRVerificationError
from kiln.loopir.ops import REDUCTION_TYPES
from kiln.loopir.virtualized import ops

__all__ = ["Loops", "Pointwise", "Reduction", "Scatter", "Indexer", "InnerFn", "ReductionFn"]

Indexer = Callable[[Sequence[sympy.Expr]], sympy.Expr]
InnerFn = Callable[[Sequence[sympy.Expr]], Any]
ReductionFn = Callable[[Sequence[sympy.Expr], Sequence[sympy.Expr]], Any]


@dataclasses.dataclass(frozen=True, eq=False)
class Loops:
    """Common fields: where the result lives and its iteration space."""

    device: torch.device
    dtype: torch.dtype
    ranges: tuple[sympy.Expr, ...]
    origin: str  # the ATen op (or pass) that made it, printed in dumps

    def get_size(self) -> tuple[sympy.Expr, ...]:
        return self.ranges

    def get_dtype(self) -> torch.dtype:
        return self.dtype

    def get_device(self) -> torch.device:
        return self.device

    def numel(self) -> sympy.Expr:
        return sizes.product(self.ranges)

    def make_loader(self) -> InnerFn:
        """Inline this computation into a consumer (only ``Pointwise`` can be)."""
        msg = f"{type(self).__name__} from {self.origin} must be realized before it is read"
        raise IRVerificationError(msg)

    def verify(self) -> None:
        for r in self.ranges:
            if not isinstance(r, sympy.Expr) or (r.is_Integer and int(r) < 0):
                msg = f"{type(self).__name__} from {self.origin} has bad range {r!r}"
                raise IRVerificationError(msg)


@dataclasses.dataclass(frozen=True, eq=False)
class Pointwise(Loops):
    """One element per index of ``ranges``."""

    inner_fn: InnerFn = dataclasses.field(default=lambda idx: None)

    def make_loader(self) -> InnerFn:
        return self.inner_fn

    def store_output(self, name: str, indexer: Indexer, index: Sequence[sympy.Expr]) -> None:
        ops.store(name, indexer(index), self.inner_fn(index))


@dataclasses.dataclass(frozen=True, eq=False)
class Reduction(Loops):
    """Folds ``inner_fn(index, rindex)`` over ``reduction_ranges`` for each ``index``.

    ``output_index`` picks one result of a multi-result reduction (welford: 0 mean,
    1 m2, 2 weight).
    """

    reduction_ranges: tuple[sympy.Expr, ...] = ()
    reduction_type: str = "sum"
    src_dtype: torch.dtype = torch.float32
    inner_fn: ReductionFn = dataclasses.field(default=lambda idx, ridx: None)
    output_index: int | None = None
    # the shape reduced and which of its dims are ``ranges + reduction_ranges``, in
    # order: lets pointwise work over that shape join the kernel in the same order
    source_ranges: tuple[sympy.Expr, ...] | None = None
    source_order: tuple[int, ...] | None = None

    def reduction_numel(self) -> sympy.Expr:
        return sizes.product(self.reduction_ranges)

    def store_output(
        self,
        name: str,
        indexer: Indexer,
        index: Sequence[sympy.Expr],
        rindex: Sequence[sympy.Expr],
    ) -> None:
        value = self.inner_fn(index, rindex)
        result = ops.reduction(self.dtype, self.src_dtype, self.reduction_type, value)
        if self.output_index is not None:
            result = result[self.output_index]
        ops.store_reduction(name, indexer(index), result)

    def verify(self) -> None:
        super().verify()
        if self.reduction_type not in REDUCTION_TYPES:
            msg = f"unknown reduction type {self.reduction_type!r} from {self.origin}"
            raise IRVerificationError(msg)
        if (self.reduction_type == "welford_reduce") != (self.output_index is not None):
            msg = "welford reductions, and only they, name an output_index"
            raise IRVerificationError(msg)


@dataclasses.dataclass(frozen=True, eq=False)
class Scatter(Loops):
    """For each index of ``ranges`` (the source's), write ``inner_fn(index)`` to
    ``output_indexer(index)`` of the target buffer, plainly or accumulating."""

    inner_fn: InnerFn = dataclasses.field(default=lambda idx: None)
    output_indexer: Callable[[Sequence[sympy.Expr]], Sequence[sympy.Expr]] = dataclasses.field(
        default=lambda idx: idx
    )
    mode: str | None = None

    def store_output(self, name: str, indexer: Indexer, index: Sequence[sympy.Expr]) -> None:
        value = self.inner_fn(index)
        ops.store(name, indexer(self.output_indexer(index)), value, mode=self.mode)
