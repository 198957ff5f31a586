"""Fusion groups: sets of scheduler nodes that become one kernel (or one wrapper call)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping

import sympy

from kiln.loopir import sizes
from kiln.loopir.ir.layout import Layout
from kiln.loopir.kernel import KernelGroup, KernelNode, NodeMode
from kiln.loopir.scheduler.nodes import SchedNode

__all__ = ["FusionGroup", "fused_shape", "node_modes", "make_kernel_group"]

_ids = itertools.count()


@dataclasses.dataclass(eq=False)
class FusionGroup:
    """Nodes in program order; ``numel``/``rnumel`` set for kernel groups."""

    nodes: list[SchedNode]
    numel: sympy.Expr = sympy.S.One
    rnumel: sympy.Expr = sympy.S.One
    uid: int = dataclasses.field(default_factory=lambda: next(_ids))
    orders: dict[SchedNode, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.nodes[0].kind

    @property
    def index(self) -> int:
        return self.nodes[0].index

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.reads = frozenset().union(*(n.reads for n in self.nodes))
        self.writes = frozenset().union(*(n.writes for n in self.nodes))

    def names(self) -> str:
        return "+".join(n.name for n in self.nodes)

    def __hash__(self) -> int:
        return self.uid


def fused_shape(nodes: Iterable[SchedNode]) -> tuple[sympy.Expr, sympy.Expr] | str:
    """The (numel, rnumel) a kernel of ``nodes`` iterates, or why there is none."""
    nodes = list(nodes)
    reductions = {n.group_key() for n in nodes if n.is_reduction()}
    if len(reductions) > 1:
        shapes = ", ".join(f"({x}, {r})" for x, r in sorted(reductions, key=str))
        return f"reductions over different iteration spaces {shapes}"
    if reductions:
        x, r = next(iter(reductions))
        for n in nodes:
            if not n.is_reduction() and node_mode(n, x, r) is None:
                numel = n.group_key()[0]
                return f"{n.name} has {numel} elements; the reduction kernel iterates ({x}, {r})"
        return x, r
    numels = {n.group_key()[0] for n in nodes}
    if len(numels) > 1:
        return f"pointwise iteration spaces differ: {sorted(map(str, numels))}"
    return next(iter(numels)), sympy.S.One


def node_mode(node: SchedNode, numel: sympy.Expr, rnumel: sympy.Expr) -> NodeMode | None:
    """Where ``node`` runs inside a kernel iterating (numel, rnumel)."""
    if node.is_reduction():
        return "xr"
    n = node.group_key()[0]
    if rnumel == 1:
        return "x" if sizes.same(n, numel) else None
    if sizes.same(n, numel * rnumel):
        return "xr"
    return "x" if sizes.same(n, numel) else None


def node_modes(
    nodes: Iterable[SchedNode], numel: sympy.Expr, rnumel: sympy.Expr
) -> list[tuple[SchedNode, NodeMode]]:
    out = []
    for n in nodes:
        mode = node_mode(n, numel, rnumel)
        assert mode is not None
        out.append((n, mode))
    return out


def make_kernel_group(
    name: str,
    nodes: list[SchedNode],
    numel: sympy.Expr,
    rnumel: sympy.Expr,
    layout_of: Callable[[str], Layout],
    read_later: Callable[[str], bool] = lambda name: True,
    orders: Mapping[SchedNode, tuple[int, ...]] | None = None,
) -> KernelGroup:
    """The ``KernelGroup`` a backend receives for ``nodes`` fused."""
    orders = orders or {}
    knodes: list[KernelNode] = [
        n.kernel_node(m, rnumel, orders.get(n)) for n, m in node_modes(nodes, numel, rnumel)
    ]
    written: list[str] = []
    read: list[str] = []
    for n in nodes:
        for r in sorted(n.reads):
            if r not in written and r not in read:
                read.append(r)
        for w in sorted(n.writes):
            if w not in written:
                written.append(w)
    inputs = tuple(r for r in read if r not in written)
    outputs = tuple(written)
    buffers: Mapping[str, Layout] = {b: layout_of(b) for b in inputs + outputs}
    internal = frozenset(w for w in outputs if not read_later(w))
    device = nodes[0].device
    return KernelGroup(
        name, device, numel, rnumel, tuple(knodes), buffers, inputs, outputs, internal
    )
