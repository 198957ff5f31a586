"""What a code generator receives: a ``KernelGroup`` of fused ``KernelNode`` s.

A kernel iterates ``xindex`` over ``numel`` and, for reductions, ``rindex`` over
``rnumel``. Each node's ``body(xindex, rindex)`` issues its loads, math and
store(s) through ``ops``; a codegen runs it under its own handler::

    with V.set_ops_handler(MyPrinter(kernel)):
        for node in group.nodes:
            node.body(XINDEX, RINDEX if node.mode == "xr" else None)

Node modes: ``"x"`` nodes run once per ``xindex`` (pointwise kernels, and
pointwise work on reduction results); ``"xr"`` nodes run inside the reduction
loop (reductions themselves, and pointwise nodes with ``numel * rnumel``
elements, whose flat index is ``xindex * rnumel + rindex``). Nodes appear in a
legal execution order: a node reads what earlier nodes wrote at exactly the
index it was written (the scheduler checked it), so a codegen may forward stored
values (a store cache) instead of reloading them. A reduction's
``store_reduction`` index depends on ``xindex`` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import sympy
import torch

from kiln.loopir import sizes
from kiln.loopir.ir.buffers import ComputedBuffer
from kiln.loopir.ir.layout import Layout
from kiln.loopir.ir.loops import Pointwise, Reduction, Scatter
from kiln.loopir.virtualized import current_ops_handler, set_ops_handler

__all__ = ["XINDEX", "RINDEX", "SEEDS", "KernelNode", "KernelGroup", "KernelCode", "NodeMode"]

XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)
SEEDS = "seeds"
"""The name of the int64 seeds buffer, passed to kernels that call ``ops.load_seed``."""

NodeMode = Literal["x", "xr"]


@dataclasses.dataclass(frozen=True, eq=False)
class KernelNode:
    """One computed buffer inside a kernel."""

    buffer: ComputedBuffer
    mode: NodeMode
    rnumel: sympy.Expr  # the kernel's, needed to flatten "xr" pointwise nodes
    order: tuple[int, ...] | None = None  # loop order the scheduler chose, if not the default

    @property
    def name(self) -> str:
        """The buffer this node writes (the target's storage for a mutation)."""
        return self.buffer.storage_name()

    @property
    def kind(self) -> Literal["pointwise", "reduction", "scatter"]:
        data = self.buffer.data
        if isinstance(data, Reduction):
            return "reduction"
        return "scatter" if isinstance(data, Scatter) else "pointwise"

    @property
    def reduction_type(self) -> str | None:
        data = self.buffer.data
        return data.reduction_type if isinstance(data, Reduction) else None

    @property
    def dtype(self) -> torch.dtype:
        return self.buffer.layout.dtype

    @property
    def origin(self) -> str:
        return self.buffer.data.origin

    def body(self, xindex: sympy.Expr, rindex: sympy.Expr | None) -> None:
        """Emit this node's loads, math and stores through ``ops``.

        Every index reaching the handler is simplified with the ranges of
        ``xindex``/``rindex`` (when they are symbols), so split-and-rejoined
        digits read as the plain flat index.
        """
        known = self._ranges(xindex, rindex)
        with set_ops_handler(_Simplifying(current_ops_handler(), known)):
            self._emit(xindex, rindex, known)

    def _ranges(self, xindex: sympy.Expr, rindex: sympy.Expr | None) -> dict[sympy.Symbol, int]:
        data = self.buffer.data
        known: dict[sympy.Symbol, int] = {}
        if isinstance(data, Reduction):
            _note_range(known, xindex, data.numel())
            if rindex is not None:
                _note_range(known, rindex, data.reduction_numel())
        elif self.mode == "xr" and rindex is not None:
            _note_range(known, xindex, data.numel() / self.rnumel)
            _note_range(known, rindex, self.rnumel)
        else:
            _note_range(known, xindex, data.numel())
        return known

    def _emit(
        self, xindex: sympy.Expr, rindex: sympy.Expr | None, known: dict[sympy.Symbol, int]
    ) -> None:
        data = self.buffer.data
        indexer = self.buffer.layout.index
        if isinstance(data, Reduction):
            assert rindex is not None, "a reduction node needs rindex"
            idx = _split(xindex, data.ranges, known)
            ridx = _split(rindex, data.reduction_ranges, known)
            data.store_output(self.name, indexer, idx, ridx)
            return
        flat = xindex * self.rnumel + rindex if self.mode == "xr" and rindex is not None else xindex
        order = self.loop_order()
        parts = _split(flat, tuple(data.ranges[d] for d in order), known)
        index: list[sympy.Expr] = [sympy.S.Zero] * len(order)
        for d, part in zip(order, parts, strict=True):
            index[d] = part
        data.store_output(self.name, indexer, index)  # type: ignore[attr-defined]

    def loop_order(self) -> tuple[int, ...]:
        """Dims from outermost to innermost loop: the output's memory order.

        A pointwise kernel writing a non-contiguous layout (say, an output that
        keeps its input's channels-last strides) walks memory in order instead
        of striding; inside reduction kernels the order must stay row-major so
        the flat index lines up with the reduction's.
        """
        if self.order is not None:
            return self.order
        ndim = len(self.buffer.data.ranges)
        identity = tuple(range(ndim))
        if self.rnumel != 1 or not isinstance(self.buffer.data, Pointwise):
            return identity
        layout = self.buffer.layout
        strides = [sizes.static_int(s) for s in layout.stride]
        if layout.is_contiguous() or any(s is None for s in strides):
            return identity
        return tuple(sorted(identity, key=lambda d: (-(strides[d] or 0), d)))


class _Simplifying:
    """Forwards to ``inner``, simplifying every index with the loop ranges first."""

    def __init__(self, inner: Any, known: dict[sympy.Symbol, int]) -> None:
        self.inner = inner
        self.known = known

    def _s(self, index: sympy.Expr) -> sympy.Expr:
        return sizes.simplify_with_ranges(index, self.known)

    def load(self, name: str, index: sympy.Expr) -> Any:
        return self.inner.load(name, self._s(index))

    def store(self, name: str, index: sympy.Expr, value: Any, mode: str | None = None) -> None:
        self.inner.store(name, self._s(index), value, mode)

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> None:
        self.inner.store_reduction(name, self._s(index), value)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> Any:
        return self.inner.index_expr(self._s(expr), dtype)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _note_range(known: dict[sympy.Symbol, int], sym: sympy.Expr, size: sympy.Expr) -> None:
    value = sizes.static_int(sympy.sympify(size))
    if isinstance(sym, sympy.Symbol) and value is not None:
        known[sym] = value


def _split(
    flat: sympy.Expr, ranges: tuple[sympy.Expr, ...], known: dict[sympy.Symbol, int]
) -> list[sympy.Expr]:
    return [sizes.simplify_with_ranges(i, known) for i in sizes.unflatten_index(flat, ranges)]


@dataclasses.dataclass(frozen=True, eq=False)
class KernelGroup:
    """A fused kernel: its nodes in order and every buffer it touches.

    ``args`` is the calling convention of the kernel callable a backend returns:
    the wrapper passes one tensor per name, in order (inputs, then outputs; the
    seeds buffer ``SEEDS`` among inputs when used). ``internal`` lists buffers
    written here that nothing after this kernel reads: the wrapper still allocates
    them, but a codegen may keep them in registers and skip the store.
    """

    name: str
    device: torch.device
    numel: sympy.Expr
    rnumel: sympy.Expr
    nodes: tuple[KernelNode, ...]
    buffers: Mapping[str, Layout]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    internal: frozenset[str] = frozenset()

    @property
    def args(self) -> tuple[str, ...]:
        return self.inputs + self.outputs

    @property
    def is_reduction(self) -> bool:
        return self.rnumel != 1

    def origins(self) -> list[str]:
        """The ATen ops fused here, for comments in generated code."""
        return list(dict.fromkeys(n.origin for n in self.nodes))

    def describe(self) -> str:
        nodes = ", ".join(f"{n.buffer.name}[{n.kind},{n.mode}]" for n in self.nodes)
        return f"{self.name}(numel={self.numel}, rnumel={self.rnumel}): {nodes}"


@dataclasses.dataclass(frozen=True)
class KernelCode:
    """A generated kernel: its source (for dumps) and the callable the wrapper calls
    as ``fn(*tensors, *sizes)``, one tensor per name of ``KernelGroup.args``, then this
    call's value of each size symbol named in ``size_args`` (ints)."""

    name: str
    source: str
    fn: Callable[..., object]
    language: str = "python"
    size_args: tuple[str, ...] = ()
    """Size symbols (by name) the kernel takes after its tensors: ones it cannot read from
    the shapes of the tensors it receives (a size only its index expressions use)."""
