"""Scheduler nodes and the dependency edges between them.

Each buffer the lowering produced becomes one node: a kernel node (computed
buffers and mutations), an extern node (ATen calls from the wrapper) or a no-op
node (picking one output of an extern call). Edges come from buffer names:
read-after-write, and for mutations write-after-write and write-after-read.
Symbolic addresses (``MemoryDep``) are computed per fusion context, since the
flat index of a node depends on the kernel it lands in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln.loopir.analysis import MemoryDep, ReadWriteHandler
from kiln.loopir.ir.buffers import Buffer, ComputedBuffer, ExternBuffer, MultiOutput, MutationBuffer
from kiln.loopir.ir.loops import Reduction
from kiln.loopir.ir.views import ReinterpretView
from kiln.loopir.kernel import RINDEX, XINDEX, KernelNode, NodeMode
from kiln.loopir.unbacked import symbols_used
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["SchedNode", "build_nodes", "AccessSet"]

NodeKind = Literal["kernel", "extern", "nop"]


@dataclasses.dataclass(frozen=True)
class AccessSet:
    """A node's reads and writes as symbolic addresses in one kernel context."""

    reads: tuple[MemoryDep, ...]
    writes: tuple[MemoryDep, ...]


@dataclasses.dataclass(eq=False)
class SchedNode:
    """One buffer's producer, in program order ``index``."""

    buffer: Buffer
    index: int
    kind: NodeKind
    reads: frozenset[str]
    writes: frozenset[str]
    preds: set[SchedNode] = dataclasses.field(default_factory=set)
    ancestors: set[SchedNode] = dataclasses.field(default_factory=set)
    _key: tuple[sympy.Expr, sympy.Expr] | None = None
    _access_cache: dict[tuple[str, sympy.Expr, tuple[int, ...] | None], AccessSet] = (
        dataclasses.field(default_factory=dict)
    )

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def device(self) -> torch.device:
        return self.buffer.layout.device

    def group_key(self) -> tuple[sympy.Expr, sympy.Expr]:
        """(numel, rnumel) of this node's own iteration space."""
        if self._key is None:
            assert isinstance(self.buffer, ComputedBuffer)
            data = self.buffer.data
            if isinstance(data, Reduction):
                self._key = (data.numel(), data.reduction_numel())
            else:
                self._key = (data.numel(), sympy.S.One)
        return self._key

    def is_reduction(self) -> bool:
        return isinstance(self.buffer, ComputedBuffer) and self.buffer.is_reduction()

    def is_mutation(self) -> bool:
        return isinstance(self.buffer, MutationBuffer)

    def kernel_node(
        self, mode: NodeMode, rnumel: sympy.Expr, order: tuple[int, ...] | None = None
    ) -> KernelNode:
        assert isinstance(self.buffer, ComputedBuffer)
        return KernelNode(self.buffer, mode, rnumel, order)

    def accesses(
        self, mode: NodeMode, rnumel: sympy.Expr, order: tuple[int, ...] | None = None
    ) -> AccessSet:
        """Reads and writes over ``xindex``/``rindex`` when run in that kernel context."""
        key = (mode, rnumel, order)
        if key not in self._access_cache:
            self._access_cache[key] = _accesses(self.kernel_node(mode, rnumel, order))
        return self._access_cache[key]

    def reduction_orders(self) -> tuple[tuple[sympy.Expr, ...], tuple[int, ...]] | None:
        """(source shape, dim order) of a reduction, for reordering pointwise partners."""
        data = getattr(self.buffer, "data", None)
        if isinstance(data, Reduction) and data.source_order is not None:
            assert data.source_ranges is not None
            return data.source_ranges, data.source_order
        return None

    def ranges(self) -> tuple[sympy.Expr, ...]:
        assert isinstance(self.buffer, ComputedBuffer)
        return tuple(self.buffer.data.ranges)

    def __repr__(self) -> str:
        return f"SchedNode({self.name}, {self.kind})"

    def __hash__(self) -> int:
        return id(self)


def _accesses(node: KernelNode) -> AccessSet:
    handler = ReadWriteHandler()
    with set_ops_handler(handler):
        node.body(XINDEX, RINDEX if node.mode == "xr" else None)
    return AccessSet(tuple(handler.reads), tuple(handler.writes))


def _names_in(value: object) -> set[str]:
    names: set[str] = set()
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, (Buffer, ReinterpretView)):
            names.add(leaf.get_name())
    return names


def _read_names(buf: Buffer) -> frozenset[str]:
    if isinstance(buf, ExternBuffer):
        return frozenset(_names_in((buf.args, buf.kwargs)))
    if isinstance(buf, MultiOutput):
        return frozenset({buf.parent.name})
    assert isinstance(buf, ComputedBuffer)
    data = buf.data
    mode: NodeMode = "xr" if isinstance(data, Reduction) else "x"
    rnumel = data.reduction_numel() if isinstance(data, Reduction) else sympy.S.One
    access = _accesses(KernelNode(buf, mode, rnumel))
    return frozenset(d.name for d in access.reads)


def _kind(buf: Buffer) -> NodeKind:
    if isinstance(buf, ExternBuffer):
        return "extern"
    if isinstance(buf, MultiOutput):
        return "nop"
    return "kernel"


def build_nodes(
    buffers: Sequence[Buffer], defined_by: Mapping[sympy.Symbol, str] | None = None
) -> list[SchedNode]:
    """Scheduler nodes in program order, with dependency edges and ancestor sets.

    ``defined_by`` names the buffer each unbacked symbol is read from: a node using the
    symbol depends on that buffer's producer, whose data it may not read."""
    nodes: list[SchedNode] = []
    writers: dict[str, list[SchedNode]] = {}
    readers: dict[str, list[SchedNode]] = {}
    for i, buf in enumerate(buffers):
        node = SchedNode(buf, i, _kind(buf), _read_names(buf), frozenset({buf.storage_name()}))
        for sym in symbols_used(buf) if defined_by else ():
            node.preds.update(writers.get(defined_by[sym], ()))  # type: ignore[index]
        for name in node.reads:
            node.preds.update(writers.get(name, ()))
        for name in node.writes:
            node.preds.update(writers.get(name, ()))
            node.preds.update(r for r in readers.get(name, ()) if r is not node)
        for name in node.reads:
            readers.setdefault(name, []).append(node)
        for name in node.writes:
            writers.setdefault(name, []).append(node)
        for pred in node.preds:
            node.ancestors |= pred.ancestors | {pred}
        nodes.append(node)
    return nodes
