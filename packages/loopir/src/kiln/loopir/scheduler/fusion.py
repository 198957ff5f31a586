"""Fusion: ``can_fuse`` and ``score_fusion``, applied greedily to a fixed point.

Two groups fuse when they run on one device, iterate compatible spaces (the
same one, or a reduction and pointwise work over its input or output), fusing
makes no cycle, every buffer passed between them is read at exactly the address
it was written (no reversed or reindexed reads across the edge), and the
backend does not veto. Among legal pairs the best score wins: vertical fusions
with a reduction first, then vertical, then horizontal; more bytes saved, then
closer in the graph. Every decision is logged on ``kiln.loopir.fusion``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable

import sympy

from kiln.loopir.backend import Backend
from kiln.loopir.ir.layout import Layout
from kiln.loopir.scheduler.groups import FusionGroup, fused_shape, make_kernel_group, node_modes
from kiln.loopir.scheduler.nodes import SchedNode

__all__ = ["fuse_groups", "can_fuse", "score_fusion", "unfused"]

fusion_log = logging.getLogger("kiln.loopir.fusion")

Score = tuple[int, int, int]
MAX_FUSED_NODES = 64


class _Dag:
    """The group-level dependency graph of the current grouping."""

    def __init__(self, groups: list[FusionGroup]) -> None:
        self.group_of: dict[SchedNode, FusionGroup] = {n: g for g in groups for n in g.nodes}
        self.preds: dict[FusionGroup, set[FusionGroup]] = {
            g: {self.group_of[p] for n in g.nodes for p in n.preds} - {g} for g in groups
        }
        self.succs: dict[FusionGroup, set[FusionGroup]] = {g: set() for g in groups}
        for g, ps in self.preds.items():
            for p in ps:
                self.succs[p].add(g)
        self._anc: dict[FusionGroup, set[FusionGroup]] = {}
        self._desc: dict[FusionGroup, set[FusionGroup]] = {}

    @staticmethod
    def _reach(start: FusionGroup, edges: dict[FusionGroup, set[FusionGroup]]) -> set[FusionGroup]:
        found: set[FusionGroup] = set()
        stack = list(edges[start])
        while stack:
            g = stack.pop()
            if g not in found:
                found.add(g)
                stack.extend(edges[g])
        return found

    def ancestors(self, g: FusionGroup) -> set[FusionGroup]:
        if g not in self._anc:
            self._anc[g] = self._reach(g, self.preds)
        return self._anc[g]

    def descendants(self, g: FusionGroup) -> set[FusionGroup]:
        if g not in self._desc:
            self._desc[g] = self._reach(g, self.succs)
        return self._desc[g]

    def makes_cycle(self, a: FusionGroup, b: FusionGroup) -> bool:
        """A path between the two through a third group: fused, they would wait on it
        and it on them."""
        for first, second in ((a, b), (b, a)):
            if (self.descendants(first) & self.ancestors(second)) - {first, second}:
                return True
        return False


@dataclasses.dataclass(frozen=True)
class FusionPlan:
    """How a fused kernel iterates: its shape and any loop orders it had to choose."""

    numel: sympy.Expr
    rnumel: sympy.Expr
    orders: dict[SchedNode, tuple[int, ...]]


Orders = dict[SchedNode, tuple[int, ...]]
_Verdict = FusionPlan | str
Veto = Callable[[list[SchedNode], sympy.Expr, sympy.Expr, Orders], str | None]


def _check_addresses(
    nodes: list[SchedNode], numel: sympy.Expr, rnumel: sympy.Expr, orders: Orders
) -> str | None:
    modes = node_modes(nodes, numel, rnumel)
    for i, (producer, pmode) in enumerate(modes):
        pw = producer.accesses(pmode, rnumel, orders.get(producer)).writes
        for consumer, cmode in modes[i + 1 :]:
            shared = producer.writes & consumer.reads
            if not shared:
                continue
            reads = consumer.accesses(cmode, rnumel, orders.get(consumer)).reads
            for name in shared:
                written = {d.index for d in pw if d.name == name}
                for dep in (d for d in reads if d.name == name):
                    if dep.is_indirect() or len(written) != 1 or dep.index not in written:
                        if not fusion_log.isEnabledFor(logging.INFO):
                            return "reindexed read"  # printing sympy is slow; nobody listens
                        return (
                            f"{consumer.name} reads {name} at {dep.index} but {producer.name} "
                            f"writes it at {', '.join(map(str, written))}"
                        )
    return None


def can_fuse(
    a: FusionGroup,
    b: FusionGroup,
    dag: _Dag,
    veto: Veto,
    cache: dict[tuple[int, int], _Verdict] | None = None,
) -> FusionPlan | str:
    """The fused (numel, rnumel), or the reason the two groups must stay apart.

    ``cache`` keeps the verdicts that depend only on the pair (not on the rest of
    the graph) across greedy rounds.
    """
    cache = {} if cache is None else cache
    key = (a.uid, b.uid)
    if key not in cache:
        cache[key] = _check_pair(a, b, veto)
    verdict = cache[key]
    if isinstance(verdict, str):
        return verdict
    if dag.makes_cycle(a, b):
        return "fusing would create a cycle through another kernel"
    return verdict


def _check_pair(a: FusionGroup, b: FusionGroup, veto: Veto) -> _Verdict:
    if a.kind != "kernel" or b.kind != "kernel":
        return "extern calls and no-ops are not fused"
    if len(a.nodes) + len(b.nodes) > MAX_FUSED_NODES:
        return f"a kernel holds at most {MAX_FUSED_NODES} nodes"
    if any(n.is_mutation() for n in a.nodes + b.nodes):
        return "mutation (scatter) kernels are not fused"
    if a.nodes[0].device != b.nodes[0].device:
        return f"different devices {a.nodes[0].device} and {b.nodes[0].device}"
    shape = fused_shape(a.nodes + b.nodes)
    if isinstance(shape, str):
        return shape
    nodes = sorted(a.nodes + b.nodes, key=lambda n: n.index)
    orders: Orders = {**a.orders, **b.orders}
    problem = _check_addresses(nodes, *shape, orders)
    if problem is not None:
        reordered = _reduction_orders(nodes, *shape, orders)
        if reordered is None or _check_addresses(nodes, *shape, reordered) is not None:
            return problem
        orders = reordered
        fusion_log.debug("reordering loops of %s to match the reduction", list(orders))
    # Horizontal into a reduction kernel: worth it only where both read some buffer at the
    # same index. A pointwise partner left in its own order makes every access of one side
    # strided (C++ gathers per lane, several times slower than a contiguous vector load).
    horizontal = not (a.writes & b.reads or b.writes & a.reads)
    if shape[1] != 1 and horizontal and not _reads_meet(a.nodes, b.nodes, *shape, orders):
        reordered = _reduction_orders(nodes, *shape, orders)
        if (
            reordered is None
            or not _reads_meet(a.nodes, b.nodes, *shape, reordered)
            or _check_addresses(nodes, *shape, reordered) is not None
        ):
            return "they read their shared buffers in different orders: no traffic saved"
        orders = reordered
    refused = veto(nodes, *shape, orders)
    return refused if refused is not None else FusionPlan(*shape, orders)


def _reads_meet(
    a: list[SchedNode], b: list[SchedNode], numel: sympy.Expr, rnumel: sympy.Expr, orders: Orders
) -> bool:
    """Whether ``a`` and ``b`` read one buffer at one index of the fused loops (one load)."""

    def reads(nodes: list[SchedNode]) -> set[tuple[str, sympy.Expr]]:
        return {
            (d.name, d.index)
            for n, mode in node_modes(nodes, numel, rnumel)
            for d in n.accesses(mode, rnumel, orders.get(n)).reads
            if not d.is_indirect()
        }

    return bool(reads(a) & reads(b))


def _reduction_orders(
    nodes: list[SchedNode], numel: sympy.Expr, rnumel: sympy.Expr, orders: Orders
) -> Orders | None:
    """Loop orders making pointwise work over a reduction's source shape iterate like
    the reduction (kept dims outside, reduced dims inside): batch norm's normalize
    step over NCHW joins its per-channel reduction this way."""
    if rnumel == 1:
        return None
    sources = [s for n in nodes if (s := n.reduction_orders()) is not None]
    if not sources:
        return None
    changed = dict(orders)
    for n, mode in node_modes(nodes, numel, rnumel):
        if n.is_reduction() or mode != "xr" or n in changed:
            continue
        for shape, order in sources:
            if tuple(n.ranges()) == tuple(shape) and order != tuple(range(len(order))):
                changed[n] = order
                break
    return changed if changed != orders else None


def score_fusion(a: FusionGroup, b: FusionGroup, nbytes: Callable[[str], int]) -> Score:
    """(category, bytes saved, -graph distance): larger is better."""
    vertical = bool(a.writes & b.reads or b.writes & a.reads)
    reduction = any(n.is_reduction() for n in a.nodes + b.nodes)
    category = (2 if reduction else 1) if vertical else 0
    shared = (a.writes & b.reads) | (b.writes & a.reads) | (a.reads & b.reads)
    saved = sum(nbytes(name) for name in shared)
    return category, saved, -abs(a.index - b.index)


def fuse_groups(
    nodes: list[SchedNode],
    backend_for: Callable[[SchedNode], Backend],
    layout_of: Callable[[str], Layout],
    nbytes: Callable[[str], int],
) -> list[FusionGroup]:
    """Greedy fusion to a fixed point; returns the groups (not yet ordered)."""
    groups = [_singleton(n) for n in nodes]
    told: set[tuple[str, str]] = set()

    def veto(
        members: list[SchedNode], numel: sympy.Expr, rnumel: sympy.Expr, orders: Orders
    ) -> str | None:
        group = make_kernel_group("candidate", members, numel, rnumel, layout_of, orders=orders)
        refused = backend_for(members[0]).fusion_veto(group)
        return f"backend refused: {refused}" if refused else None

    cache: dict[tuple[int, int], _Verdict] = {}
    changed = True
    while changed:
        # one round: every legal pair, best score first; later pairs re-checked
        # against the grouping the earlier fusions of the round produced
        changed = False
        dag = _Dag(groups)
        scored = []
        for a, b in _candidate_pairs(groups):
            verdict = can_fuse(a, b, dag, veto, cache)
            if isinstance(verdict, str):
                _tell(told, a, b, verdict)
                continue
            scored.append((score_fusion(a, b, nbytes), a.uid, b.uid, a, b))
        scored.sort(key=lambda item: item[:3], reverse=True)
        alive = set(groups)
        for score, _, _, a, b in scored:
            if a not in alive or b not in alive:
                continue
            verdict = can_fuse(a, b, dag, veto, cache)
            if isinstance(verdict, str):
                _tell(told, a, b, verdict)
                continue
            numel, rnumel = verdict.numel, verdict.rnumel
            members = sorted(a.nodes + b.nodes, key=lambda n: n.index)
            merged = FusionGroup(members, numel, rnumel, orders=verdict.orders)
            fusion_log.info(
                "fusing %s and %s into %s (numel=%s, rnumel=%s, score=%s)",
                a.names(), b.names(), merged.names(), numel, rnumel, score,
            )  # fmt: skip
            alive -= {a, b}
            alive.add(merged)
            groups = [g for g in groups if g is not a and g is not b] + [merged]
            dag = _Dag(groups)
            changed = True
    return groups


def _tell(told: set[tuple[str, str]], a: FusionGroup, b: FusionGroup, reason: str) -> None:
    key = (a.names(), b.names())
    if key not in told:
        told.add(key)
        fusion_log.info("not fusing %s and %s: %s", a.names(), b.names(), reason)


def unfused(nodes: list[SchedNode]) -> list[FusionGroup]:
    """One group per node: what ``fusion=False`` compiles (for debugging fusion)."""
    return [_singleton(n) for n in nodes]


def _singleton(node: SchedNode) -> FusionGroup:
    if node.kind != "kernel":
        return FusionGroup([node])
    numel, rnumel = node.group_key()
    return FusionGroup([node], numel, rnumel)


def _scalar(g: FusionGroup) -> bool:
    """A kernel of one element: BatchNorm's ``num_batches_tracked + 1`` in training, one
    per BatchNorm layer. Alone, each costs a launch for one add."""
    return g.kind == "kernel" and g.numel == 1 and g.rnumel == 1


def _candidate_pairs(groups: list[FusionGroup]) -> list[tuple[FusionGroup, FusionGroup]]:
    """Pairs of kernel groups that share a buffer (the only fusions that save traffic),
    and neighbouring one-element kernels (which save launches)."""
    by_name: dict[str, list[FusionGroup]] = {}
    for g in groups:
        if g.kind != "kernel":
            continue
        for name in g.reads | g.writes:
            by_name.setdefault(name, []).append(g)
    pairs: dict[tuple[int, int], tuple[FusionGroup, FusionGroup]] = {}
    for members in by_name.values():
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                first, second = (a, b) if a.index <= b.index else (b, a)
                pairs[(first.uid, second.uid)] = (first, second)
    scalars = sorted((g for g in groups if _scalar(g)), key=lambda g: g.index)
    for first, second in itertools.pairwise(scalars):
        pairs[(first.uid, second.uid)] = (first, second)
    return sorted(pairs.values(), key=lambda p: (p[0].index, p[1].index))
