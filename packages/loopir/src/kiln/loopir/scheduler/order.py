"""Ordering fused groups into a program: kernels, extern calls and no-ops, in a
legal order close to the original one, each kernel handed to its backend."""

from __future__ import annotations

import dataclasses
import heapq
import logging
from collections.abc import Callable, Mapping, Sequence

import sympy

from kiln.loopir.backend import Backend
from kiln.loopir.ir.buffers import Buffer, ExternBuffer, MultiOutput
from kiln.loopir.ir.layout import Layout
from kiln.loopir.kernel import KernelCode, KernelGroup
from kiln.loopir.scheduler.fusion import fuse_groups, unfused
from kiln.loopir.scheduler.groups import FusionGroup, make_kernel_group
from kiln.loopir.scheduler.nodes import SchedNode, build_nodes

__all__ = ["Step", "KernelStep", "ExternStep", "NopStep", "schedule"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class KernelStep:
    group: KernelGroup
    code: KernelCode
    reads: frozenset[str]
    writes: frozenset[str]
    backend: str = ""


@dataclasses.dataclass(frozen=True)
class ExternStep:
    buffer: ExternBuffer
    reads: frozenset[str]
    writes: frozenset[str]


@dataclasses.dataclass(frozen=True)
class NopStep:
    buffer: MultiOutput
    reads: frozenset[str]
    writes: frozenset[str]


Step = KernelStep | ExternStep | NopStep


def _topological(groups: list[FusionGroup]) -> list[FusionGroup]:
    group_of = {n: g for g in groups for n in g.nodes}
    preds = {g: {group_of[p] for n in g.nodes for p in n.preds} - {g} for g in groups}
    users: dict[FusionGroup, list[FusionGroup]] = {g: [] for g in groups}
    for g, ps in preds.items():
        for p in ps:
            users[p].append(g)
    waiting = {g: len(ps) for g, ps in preds.items()}
    ready = [(g.index, g.uid, g) for g in groups if waiting[g] == 0]
    heapq.heapify(ready)
    order: list[FusionGroup] = []
    while ready:
        _, _, g = heapq.heappop(ready)
        order.append(g)
        for u in users[g]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (u.index, u.uid, u))
    assert len(order) == len(groups), "fusion produced a cycle"
    return order


def schedule(
    buffers: Sequence[Buffer],
    layout_of: Callable[[str], Layout],
    backend_for: Callable[[SchedNode], Backend],
    keep: set[str],
    fuse: bool = True,
    defined_by: Mapping[sympy.Symbol, str] | None = None,
) -> list[Step]:
    """Fuse, order, and generate code: the program the wrapper will print.

    ``keep`` names buffers needed after the program (graph outputs): never internal.
    ``defined_by``: the buffer each unbacked symbol is read from (see ``build_nodes``).
    """
    nodes = build_nodes(buffers, defined_by)

    sizes_cache: dict[str, int] = {}

    def nbytes(name: str) -> int:
        if name not in sizes_cache:
            try:
                sizes_cache[name] = layout_of(name).nbytes()
            except (KeyError, ValueError):
                sizes_cache[name] = 0
        return sizes_cache[name]

    fused = fuse_groups(nodes, backend_for, layout_of, nbytes) if fuse else unfused(nodes)
    groups = _topological(fused)
    steps: list[Step] = []
    later_reads: list[set[str]] = []
    acc: set[str] = set(keep)
    for g in reversed(groups):
        later_reads.append(set(acc))
        acc |= g.reads
    later_reads.reverse()
    kernel_ids = 0
    for g, after in zip(groups, later_reads, strict=True):
        reads, writes = frozenset(g.reads), frozenset(g.writes)
        node = g.nodes[0]
        if g.kind == "extern":
            assert isinstance(node.buffer, ExternBuffer)
            steps.append(ExternStep(node.buffer, reads, writes))
        elif g.kind == "nop":
            assert isinstance(node.buffer, MultiOutput)
            steps.append(NopStep(node.buffer, reads, writes))
        else:
            name = f"kernel{kernel_ids}"
            kernel_ids += 1
            group = make_kernel_group(
                name, g.nodes, g.numel, g.rnumel, layout_of, after.__contains__, g.orders
            )
            backend = backend_for(node)
            code = backend.codegen_kernel(group)
            io = frozenset(group.inputs), frozenset(group.outputs)
            steps.append(KernelStep(group, code, *io, backend=backend.name))
    return steps
