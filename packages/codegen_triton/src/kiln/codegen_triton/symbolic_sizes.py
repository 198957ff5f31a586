"""Kernels over symbolic sizes: which size symbols a kernel takes, and the per-call sizes.

A graph compiled with dynamic shapes hands the backend layouts and index expressions over the
capture's size symbols (``s0, s1, ...``). The kernel takes each symbol its index expressions
use as an integer argument after ``xnumel``/``rnumel``, so one compiled kernel serves every
size; Triton specialises integer arguments divisible by 16 (and equal to 1) by itself, which
is where a size that is a multiple of 16 gets aligned, vectorised accesses. loopir's wrapper
binds each symbol once per call and passes the values (``KernelCode.size_args``); the
launcher computes ``xnumel``, ``rnumel`` and the grid from them with one generated Python
function (:meth:`SymbolicSizes.evaluator`), never with sympy per call.

Choices that need a number (block sizes, 2-D tiling) use the hints of the call being
compiled and add no guard. A persistent reduction holds the whole row in one block, so a
symbolic row length takes one only when its range (the guards') bounds it by the limit; other
rows loop. 32-bit indexing is kept when the ranges prove it enough or the hints say so; a
later call past 2**31-1 elements is refused by the launcher rather than overflowing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import sympy

from kiln.codegen_triton.errors import TritonCodegenError
from kiln.loopir import serialize, symbolic
from kiln.loopir.index_printer import IndexPrinter
from kiln.loopir.kernel import KernelGroup

__all__ = ["SymbolicSizes", "group_symbols", "upper_bound", "bucket"]


class _PythonSizes(IndexPrinter):
    """Sizes as Python over the symbols (floor division and remainder as Python's own)."""

    error = TritonCodegenError


_PRINTER = _PythonSizes()


def group_symbols(group: KernelGroup) -> set[sympy.Symbol]:
    """The size symbols of a kernel's loop lengths and buffer layouts."""
    exprs: list[sympy.Basic | int] = [sympy.sympify(group.numel), sympy.sympify(group.rnumel)]
    for layout in group.buffers.values():
        exprs += [*layout.size, *layout.stride, layout.offset]
    return symbolic.size_symbols(exprs)


def upper_bound(expr: sympy.Expr) -> float:
    """The largest value ``expr`` takes in any call the guards admit (``inf`` if unknown)."""
    return -symbolic.lower_bound(-sympy.sympify(expr))


def bucket(n: int) -> int:
    """The power of two at or above ``n``: the size class a launch config is tuned for."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class SymbolicSizes:
    """What a launcher needs to size a symbolic kernel's launch from the call's sizes."""

    args: tuple[str, ...]
    """The size symbols the launcher receives after the tensors (sorted by name)."""
    params: tuple[str, ...]
    """Those the kernel takes after ``xnumel``/``rnumel`` (its index expressions use them)."""
    numel: sympy.Expr
    rnumel: sympy.Expr
    extents: tuple[sympy.Expr, ...]
    """Element counts a 32-bit kernel must keep below 2**31 (empty for a 64-bit kernel)."""
    hints: tuple[int, ...]
    """The values of ``args`` in the call being compiled (compile workers warm with them)."""

    __reduce__ = serialize.by_fields

    def evaluator(self) -> Callable[..., tuple[int, ...]]:
        """``f(*args) -> (xnumel, rnumel, largest extent, *params)``, generated Python."""
        extent = f"max({', '.join(map(_PRINTER.print, self.extents))}, 0)" if self.extents else "0"
        parts = [_PRINTER.print(self.numel), _PRINTER.print(self.rnumel), extent, *self.params]
        source = f"def sizes({', '.join(self.args)}):\n    return ({', '.join(parts)},)\n"
        namespace: dict[str, object] = {}
        exec(compile(source, "<kiln.codegen_triton sizes>", "exec"), namespace)
        return namespace["sizes"]  # type: ignore[return-value]

    def param_hints(self) -> list[int]:
        """``xnumel``, ``rnumel`` (for reductions) and the params at the hints."""
        values = dict(zip(self.args, self.hints, strict=True))
        return [values[p] for p in self.params]


def make_sizes(
    group: KernelGroup, used: Iterable[sympy.Symbol], extents: Iterable[sympy.Expr]
) -> SymbolicSizes:
    """The sizes of ``group``'s kernel whose source uses the size symbols ``used``."""
    found = group_symbols(group) | set(used)
    args = tuple(sorted((s.name for s in found), key=_symbol_order))
    by_name = {s.name: s for s in found}
    params = tuple(sorted((s.name for s in used), key=_symbol_order))
    return SymbolicSizes(
        args,
        params,
        sympy.sympify(group.numel),
        sympy.sympify(group.rnumel),
        tuple(extents),
        tuple(symbolic.hint(by_name[a]) for a in args),
    )


def _symbol_order(name: str) -> tuple[int, str]:
    return (int(name[1:]) if name[1:].isdigit() else -1, name)
