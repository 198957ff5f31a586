"""2-D tiling of pointwise kernels, so transposes read and write coalesced.

loopir iterates a pointwise kernel over one flat ``xindex``. When one access is
contiguous along the flat index and another along a coarser digit of it (a
transpose: ``out[i, j] = a[i, j] + b[j, i]``), a 1-D block makes one of them
stride through memory. Splitting ``xindex = yindex * X + xindex'`` gives a
``[XBLOCK, YBLOCK]`` tile in which each access is unit-stride along one axis;
Triton then gives each load and store its own coalesced layout and moves data
between them through shared memory.
"""

from __future__ import annotations

import sympy

from kiln.loopir import sizes
from kiln.loopir.analysis import MemoryDep, ReadWriteHandler
from kiln.loopir.kernel import XINDEX, KernelGroup
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["YINDEX", "choose_tile", "split_index", "MAX_GRID_Y"]

YINDEX = sympy.Symbol("yindex", integer=True, nonnegative=True)
MAX_GRID_Y = 65535


def split_index(expr: sympy.Expr, inner: int, outer: int) -> sympy.Expr:
    """``expr`` over the flat ``xindex`` rewritten over ``yindex`` (outer) and ``xindex`` (inner)."""
    split = sympy.expand(expr.subs(XINDEX, YINDEX * inner + XINDEX))
    return sizes.simplify_with_ranges(split, {XINDEX: inner, YINDEX: outer})


def _accesses(group: KernelGroup) -> list[MemoryDep]:
    handler = ReadWriteHandler()
    with set_ops_handler(handler):
        for node in group.nodes:
            node.body(XINDEX, None)
    return [
        d for d in handler.reads + handler.writes if not d.is_indirect() and d.name in group.buffers
    ]


def _unit_along(expr: sympy.Expr, sym: sympy.Symbol) -> bool:
    """True when ``expr`` steps by one as ``sym`` does (at least in runs: ``sym % m``)."""
    for term in sympy.Add.make_args(expr):
        if term == sym:
            return True
        if isinstance(term, sizes.ModularIndexing) and term.args[0] == sym and term.args[1] == 1:
            return True
    return False


def _candidates(deps: list[MemoryDep], numel: int) -> list[int]:
    found: list[int] = []
    for dep in deps:
        for atom in dep.index.atoms(sizes.ModularIndexing, sizes.FloorDiv):
            if atom.args[0] != XINDEX:
                continue
            span = (
                atom.args[2] * atom.args[1]
                if isinstance(atom, sizes.ModularIndexing)
                else atom.args[1]
            )
            value = sizes.static_int(span)
            if value and 1 < value < numel and numel % value == 0 and value not in found:
                found.append(value)
    return sorted(found)


def choose_tile(group: KernelGroup) -> int | None:
    """The inner size ``X`` of a 2-D tiling that makes every access unit-stride on some axis."""
    if group.is_reduction or any(n.kind != "pointwise" for n in group.nodes):
        return None
    numel = sizes.static_int(group.numel)
    if numel is None or numel < 64:
        return None
    deps = _accesses(group)
    for inner in _candidates(deps, numel):
        outer = numel // inner
        if outer < 2 or inner < 2:
            continue
        split = [split_index(d.index, inner, outer) for d in deps]
        along_x = [_unit_along(e, XINDEX) for e in split]
        along_y = [_unit_along(e, YINDEX) for e in split]
        coalesced = all(
            x or y or not e.free_symbols for x, y, e in zip(along_x, along_y, split, strict=True)
        )
        if coalesced and any(along_x) and any(along_y):
            return inner
    return None
