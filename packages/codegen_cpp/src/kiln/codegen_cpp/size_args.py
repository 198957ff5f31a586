"""Where a kernel learns its symbolic sizes: from its tensors' shapes, or as arguments.

A kernel over symbolic sizes takes each size symbol as an ``int64_t`` parameter. One that is
a dimension of a tensor the kernel receives is read from that tensor's shape by the Python
side (loopir's calling convention of tensors alone covers it, as a kernel called by hand in
the tests is). One that is not (a size only an index expression uses: the count a mean
divides by, a flat view's factor) is a *size argument*: loopir's wrapper, which binds every
size symbol once per call, passes its value after the tensors (``KernelCode.size_args``).
The symbol of a Python float input (``symbolic.is_number_symbol``) is such an argument too,
taken as a ``double``.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from kiln.codegen_cpp.errors import CodegenCppError
from kiln.loopir import symbolic
from kiln.loopir.analysis import ReadWriteHandler
from kiln.loopir.kernel import RINDEX, XINDEX, KernelGroup
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["float_args", "size_bindings"]


class _SizeUses(ReadWriteHandler):
    """Records the symbols of every index and index value a kernel's bodies compute."""

    def __init__(self) -> None:
        super().__init__()
        self.exprs: list[sympy.Expr] = []

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> Any:
        self.exprs.append(sympy.sympify(expr))
        return self._op("index_expr")

    def indirect_indexing(self, x: Any, size: sympy.Expr, check: bool = True) -> sympy.Symbol:
        self.exprs.append(sympy.sympify(size))
        return super().indirect_indexing(x, size, check)


def _body_symbols(group: KernelGroup) -> set[sympy.Symbol]:
    handler = _SizeUses()
    with set_ops_handler(handler):
        for node in group.nodes:
            node.body(XINDEX, RINDEX if node.mode == "xr" else None)
    exprs = [*handler.exprs, *(d.index for d in (*handler.reads, *handler.writes))]
    return symbolic.size_symbols(exprs)


def size_bindings(group: KernelGroup) -> tuple[dict[str, tuple[int, int]], tuple[str, ...]]:
    """Each size symbol of ``group`` read from a tensor, as (argument, dimension), and the
    size arguments the caller passes (sorted by name).

    A symbol of the layouts or loop lengths that is no size symbol of Kiln's shape
    environment raises ``CodegenCppError``: nothing could pass its value.
    """
    found: set[sympy.Symbol] = set()
    for expr in (group.numel, group.rnumel):
        found |= sympy.sympify(expr).free_symbols
    for layout in group.buffers.values():
        for expr in (*layout.size, *layout.stride, layout.offset):
            found |= sympy.sympify(expr).free_symbols
    foreign = sorted(s.name for s in found if not symbolic.is_symbolic(s))
    if foreign:
        msg = (
            f"{group.name}: symbol {', '.join(foreign)} is not the size of any tensor the "
            "kernel receives nor a size symbol, so the C++ kernel cannot learn its value"
        )
        raise CodegenCppError(msg)
    if found or symbolic.in_symbolic_graph():  # else no body holds a size symbol either
        found |= _body_symbols(group)
    bindings: dict[str, tuple[int, int]] = {}
    passed: list[str] = []
    for sym in sorted(found, key=lambda s: s.name):
        where = next(
            (
                (pos, dim)
                for pos, name in enumerate(group.args)
                for dim, size in enumerate(group.buffers[name].size)
                if size == sym
            ),
            None,
        )
        if where is None:
            passed.append(sym.name)
        else:
            bindings[sym.name] = where
    return bindings, tuple(passed)


def float_args(names: tuple[str, ...], group: KernelGroup) -> frozenset[str]:
    """Those of the size arguments ``names`` that are float number symbols (``double``)."""
    if not names:
        return frozenset()
    floats = {s.name for s in _body_symbols(group) if symbolic.is_number_symbol(s)}
    return frozenset(n for n in names if n in floats)
