"""The analysis ``ops`` handler: what a kernel body reads, writes and computes.

Running a body under :class:`ReadWriteHandler` records every access as a
``MemoryDep`` (buffer name plus symbolic storage index) and counts ops. The
scheduler decides fusion legality by comparing these symbolic addresses; the
lowering decides when to stop inlining by the op counts.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import sympy
import torch

from kiln.loopir import sizes

__all__ = ["MemoryDep", "ReadWriteHandler", "INDIRECT_PREFIX"]

INDIRECT_PREFIX = "indirect"


@dataclasses.dataclass(frozen=True)
class MemoryDep:
    """One access: ``name`` at ``index`` (a sympy expression over kernel symbols)."""

    name: str
    index: sympy.Expr
    mode: str | None = None

    def is_indirect(self) -> bool:
        """True when the address depends on loaded data (unknown at compile time)."""
        return any(sizes.is_index_symbol(s, INDIRECT_PREFIX) for s in self.index.free_symbols)


class _Value:
    """An opaque value; indexable because welford results are triples."""

    def __getitem__(self, i: int) -> _Value:
        return self


class ReadWriteHandler:
    """Collects reads, writes and op counts of the bodies run under it."""

    def __init__(self) -> None:
        self.reads: list[MemoryDep] = []
        self.writes: list[MemoryDep] = []
        self.op_counts: collections.Counter[str] = collections.Counter()
        self.exprs: list[sympy.Expr] = []
        """Expressions computed as values (``index_expr``) and indirect bounds."""
        self._indirect = itertools.count()

    def _op(self, name: str) -> _Value:
        self.op_counts[name] += 1
        return _Value()

    def load(self, name: str, index: sympy.Expr) -> _Value:
        self.reads.append(MemoryDep(name, sympy.sympify(index)))
        return self._op("load")

    def store(self, name: str, index: sympy.Expr, value: Any, mode: str | None = None) -> None:
        self.writes.append(MemoryDep(name, sympy.sympify(index), mode))
        self._op("store")

    def reduction(
        self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any
    ) -> _Value:
        return self._op("reduction")

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> None:
        self.writes.append(MemoryDep(name, sympy.sympify(index)))
        self._op("store")

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> _Value:
        self.exprs.append(sympy.sympify(expr))
        return self._op("index_expr")

    def indirect_indexing(self, x: Any, size: sympy.Expr, check: bool = True) -> sympy.Symbol:
        self.exprs.append(sympy.sympify(size))
        self._op("indirect_indexing")
        return sizes.index_symbol(INDIRECT_PREFIX, next(self._indirect))

    def load_seed(self, name: str, offset: int) -> _Value:
        self.reads.append(MemoryDep(name, sympy.Integer(offset)))
        return self._op("load_seed")

    def masked(self, mask: Any, body: Callable[[], Any], other: bool | float) -> _Value:
        body()
        return self._op("masked")

    def __getattr__(self, name: str) -> Callable[..., _Value]:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._op(name)

    def read_names(self) -> set[str]:
        return {d.name for d in self.reads}

    def write_names(self) -> set[str]:
        return {d.name for d in self.writes}

    def compute_ops(self) -> int:
        """Ops that cost work when duplicated (loads and math, not constants)."""
        skip = {"constant", "store", "index_expr"}
        return sum(n for op, n in self.op_counts.items() if op not in skip)

    def addresses(self) -> list[sympy.Expr]:
        """Every expression the bodies run compute with: addresses, values, bounds."""
        return [*self.exprs, *(d.index for d in (*self.reads, *self.writes))]
