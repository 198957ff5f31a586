"""Per-channel loads of channels-last pointwise kernels, read from a table of one channel row.

In an NHWC buffer the channel of element ``xindex`` is ``xindex % C``, so a per-channel value
(batch norm's mean, variance, weight and bias; a convolution's bias) is loaded at
``ModularIndexing(xindex, 1, C)``. When ``C`` is not a whole number of vectors (12, 20, 36
channels against 8 or 16 lanes), a vector's lanes wrap around the row at a place that changes
from vector to vector: the load is neither contiguous nor broadcast and was gathered lane by
lane (a modulo and a scalar read per lane, for each such load of each vector). Rows of ``C``
elements with a scalar tail (``loops.LoopNests._row_period``) do not suit either: the tail
would be a large part of each short row.

Instead the kernel fills, before its loop, a small table with the ``C`` values followed by
the first ``lanes`` of them again; the vector at ``xindex`` is then one contiguous load at
``table + xindex % C``, the same values the gather read.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
import torch

from kiln.codegen_cpp.dtypes import compute_ctype, vector_ctype
from kiln.codegen_cpp.ops import CppVar
from kiln.codegen_cpp.printer import cpp_index
from kiln.loopir.sizes import ModularIndexing

__all__ = ["MAX_PERIOD", "TABLE_DTYPES", "periodic_index", "table_load"]

MAX_PERIOD = 4096
"""The longest row a table holds (16 KB of float32 on the stack per table)."""

TABLE_DTYPES = frozenset({torch.float32, torch.float64, torch.int32, torch.int64})
"""Dtypes whose table holds the loaded values as stored (a plain vector ``loadu`` reads it)."""

_J = sympy.Symbol("j", integer=True, nonnegative=True)


def periodic_index(
    index: sympy.Expr, var: sympy.Symbol, lanes: int
) -> tuple[int, sympy.Expr] | None:
    """``(C, f)`` where ``index`` is ``f(var % C)``, ``f`` over the symbol ``j`` alone, when
    ``C`` is no multiple of ``lanes`` (a multiple loads contiguously already) and at most
    ``MAX_PERIOD``; else None."""
    mods = [
        m
        for m in index.atoms(ModularIndexing)
        if m.args[0] == var and m.args[1] == 1 and m.args[2].is_Integer
    ]
    if len(mods) != 1:
        return None
    period = int(mods[0].args[2])
    if period % lanes == 0 or period > MAX_PERIOD:
        return None
    f = index.subs(mods[0], _J)
    return None if f.free_symbols - {_J} else (period, f)


def table_load(
    cache: dict[str, CppVar],
    hoisted: list[str],
    name: str,
    index: sympy.Expr,
    var: sympy.Symbol,
    lanes: int,
    dtype: torch.dtype,
    read: Callable[[str], str],
) -> str | None:
    """The vector load of buffer ``name`` at ``index`` from a table, declared and filled in
    ``hoisted`` (once per buffer and row: ``cache``), or None where ``index`` is not periodic.
    ``read(i)`` is the C++ read of the buffer's element ``i``. The table holds ``f(j)`` for
    ``j`` below ``C``, then its first entries again up to ``C + lanes`` (copied in order, so
    a row shorter than a vector repeats as often as needed)."""
    found = periodic_index(index, var, lanes)
    if found is None:
        return None
    period, f = found
    key = f"table:{name}:{f}:{period}"
    table = cache.get(key)
    if table is None:
        table = CppVar(f"table{sum(k.startswith('table:') for k in cache)}", dtype)
        size = period + lanes
        hoisted += [
            f"alignas(64) {compute_ctype(dtype)} {table}[{size}];",
            f"for (int64_t j = 0; j < {period}; ++j) {table}[j] = {read(cpp_index(f))};",
            f"for (int64_t j = {period}; j < {size}; ++j) {table}[j] = {table}[j - {period}];",
        ]
        cache[key] = table
    offset = cpp_index(ModularIndexing(var, 1, period))
    return f"{vector_ctype(dtype)}::loadu({table} + {offset})"
