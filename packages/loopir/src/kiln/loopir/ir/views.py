"""Views: index remapping with no copies, and the boxes lowerings pass around.

``View`` maps its indices onto another node's (permute, expand, slice, reshape
are all just ``reindex`` functions). ``ReinterpretView`` is a strided window on a
realized buffer, what the wrapper can hand to ATen as a tensor. ``StorageBox``
holds either unrealized ``Loops`` (inlined into consumers) or a buffer;
``TensorBox`` is what a lowering receives and returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Union

import sympy
import torch

from kiln.loopir import sizes
from kiln.loopir.analysis import ReadWriteHandler
from kiln.loopir.ir.buffers import Buffer, ComputedBuffer
from kiln.loopir.ir.layout import Layout
from kiln.loopir.ir.loops import Loops, Pointwise
from kiln.loopir.virtualized import V, ops, set_ops_handler

__all__ = [
    "View", "ReinterpretView", "StorageBox", "TensorBox", "IRNode", "Reindex",
    "REALIZE_DUPLICATED_OPS", "REALIZE_MAX_OPS", "REALIZE_MAX_READS",
]  # fmt: skip

REALIZE_DUPLICATED_OPS = 24
"""Realize a pointwise value once inlining it would repeat more than this many ops."""
REALIZE_MAX_OPS = 96
"""Realize a pointwise value read several times whose body grew beyond this many ops."""
REALIZE_MAX_READS = 4
"""Realize a pointwise value read several times whose body loads more buffers than this."""

Reindex = Callable[[Sequence[sympy.Expr]], Sequence[sympy.Expr]]


@dataclasses.dataclass(frozen=True, eq=False)
class View:
    """``data`` seen through ``reindex`` with sizes ``size``."""

    data: IRNode
    size: tuple[sympy.Expr, ...]
    reindex: Reindex
    origin: str

    def get_size(self) -> tuple[sympy.Expr, ...]:
        return self.size

    def get_dtype(self) -> torch.dtype:
        return self.data.get_dtype()

    def get_device(self) -> torch.device:
        return self.data.get_device()

    def make_loader(self) -> Callable[[Sequence[sympy.Expr]], Any]:
        inner = self.data.make_loader()
        reindex = self.reindex
        return lambda index: inner(reindex(index))


@dataclasses.dataclass(frozen=True, eq=False)
class ReinterpretView:
    """A strided window (``layout``) on ``buffer``'s storage."""

    buffer: Buffer
    layout: Layout

    def get_size(self) -> tuple[sympy.Expr, ...]:
        return self.layout.size

    def get_dtype(self) -> torch.dtype:
        return self.layout.dtype

    def get_device(self) -> torch.device:
        return self.layout.device

    def get_name(self) -> str:
        return self.buffer.get_name()

    def make_loader(self) -> Callable[[Sequence[sympy.Expr]], Any]:
        name, layout = self.buffer.get_name(), self.layout
        return lambda index: ops.load(name, layout.index(index))


@dataclasses.dataclass(eq=False)
class StorageBox:
    """Unrealized ``Loops`` until someone needs memory, then a ``ComputedBuffer``."""

    data: Loops | Buffer
    split: Callable[[Layout], Buffer] | None = None
    """Another way to store the value, given the buffer's layout: a ``cat``'s pieces each
    copied into its window (backends whose traits say ``pointwise_cat=False``). Until then the
    value stays one loop that consumers may inline."""

    def get_size(self) -> tuple[sympy.Expr, ...]:
        return tuple(self.data.get_size())

    def get_dtype(self) -> torch.dtype:
        return self.data.get_dtype()

    def get_device(self) -> torch.device:
        return self.data.get_device()

    def make_loader(self) -> Callable[[Sequence[sympy.Expr]], Any]:
        return self.data.make_loader()  # type: ignore[no-any-return]

    def is_realized(self) -> bool:
        return isinstance(self.data, Buffer)

    def repeats_too_much(self, reads: int) -> bool:
        """Whether inlining this unrealized pointwise body ``reads`` times costs too much.

        Each inlined copy recomputes the body: a value with several users, or one a
        gather reads at several positions (max-pool backward's window taps), is
        stored once instead when the copies would repeat many ops or load many buffers.
        """
        if not isinstance(self.data, Pointwise) or reads <= 1:
            return False
        handler = _traced(self.data)[1]
        count = handler.compute_ops()
        if len({dep.name for dep in handler.reads}) > REALIZE_MAX_READS:
            return True  # each copy would load them all again (a residual stream's sum)
        return count * (reads - 1) > REALIZE_DUPLICATED_OPS or count > REALIZE_MAX_OPS

    def body_ops(self) -> int:
        """The ops (loads and math) one element of this unrealized pointwise body costs; 0
        for anything else."""
        return _traced(self.data)[1].compute_ops() if isinstance(self.data, Pointwise) else 0

    def read_order(self) -> list[int] | None:
        """The dim order (outermost first) in which this unrealized 4-D pointwise body reads
        a source it walks along every dim (steps of one fixed size per dim, all different,
        split digits rejoined), or None: the order that makes that read walk memory in order."""
        if not isinstance(self.data, Pointwise) or len(self.data.ranges) != 4:
            return None
        index, handler = _traced(self.data)
        long = [d for d, n in enumerate(self.data.ranges) if sizes.static_int(n) != 1]
        for dep in handler.reads:
            found = sizes.affine_strides(sizes.merge_digits(dep.index), index)
            if found is None or not all(s.is_Integer for s in found[1]):
                continue
            steps = [int(s) for s in found[1]]
            if all(steps[d] > 0 for d in long) and len({steps[d] for d in long}) == len(long):
                return sorted(range(4), key=lambda d: (-steps[d], d))
        return None

    def realize(self, strides: Sequence[int | sympy.Expr] | None = None) -> Buffer:
        """Store the computation in a buffer (registered with ``V.graph``), with ``strides``
        if given (eager's, for an output); idempotent."""
        if isinstance(self.data, Buffer):
            return self.data
        loops = self.data
        order = self.read_order() if V.graph.channels_last and strides is None else None
        layout = V.graph.new_layout(loops.get_device(), loops.get_dtype(), loops.get_size(), order)
        if strides is not None:
            layout = layout.with_strides(strides)
        if self.split is not None:
            buf = self.split(layout)
        else:
            buf = ComputedBuffer(name="", layout=layout, data=loops)
            V.graph.register_buffer(buf)
        self.data = buf
        return buf


def _traced(body: Pointwise) -> tuple[list[sympy.Symbol], ReadWriteHandler]:
    """``body`` run once over symbolic indices: its reads and op counts."""
    index = [sizes.index_symbol("i", n) for n in range(len(body.ranges))]
    handler = ReadWriteHandler()
    with set_ops_handler(handler):
        body.inner_fn(index)
    return index, handler


IRNode = Union[View, ReinterpretView, StorageBox, Buffer, Loops]  # noqa: UP007


@dataclasses.dataclass(eq=False)
class TensorBox:
    """The value of one FX node during lowering."""

    data: IRNode

    @staticmethod
    def from_loops(loops: Loops) -> TensorBox:
        return TensorBox(StorageBox(loops))

    def get_size(self) -> tuple[sympy.Expr, ...]:
        return tuple(self.data.get_size())

    def get_dtype(self) -> torch.dtype:
        return self.data.get_dtype()

    def get_device(self) -> torch.device:
        return self.data.get_device()

    def make_loader(self) -> Callable[[Sequence[sympy.Expr]], Any]:
        return self.data.make_loader()  # type: ignore[no-any-return]

    def dim(self) -> int:
        return len(self.get_size())

    def numel(self) -> sympy.Expr:
        return sizes.product(self.get_size())

    def storage(self) -> StorageBox | None:
        """The box under any views, when there is one."""
        node: Any = self.data
        while isinstance(node, View):
            node = node.data
        return node if isinstance(node, StorageBox) else None


def pointwise_copy(x: TensorBox, origin: str) -> TensorBox:
    """A fresh ``Pointwise`` with ``x``'s values (what a realized view copy needs)."""
    return TensorBox.from_loops(
        Pointwise(x.get_device(), x.get_dtype(), x.get_size(), origin, x.make_loader())
    )
