"""Split a joint graph into a forward and a backward graph: the partitioning policy.

The policy decides what may be recomputed in the backward (pointwise ops, views,
broadcasts, casts, constant factories: cheap, and fusible by the loop compiler)
and what must not (matmuls, convolutions, reductions, random ops, whose bits
must match the forward's, and values a backward matmul or convolution reads);
:mod:`kiln.autograd_aot.mincut` then picks the cheapest set of values to save. ``save_all`` saves every forward value the
backward uses, the baseline the statistics compare against.

Ops of an activation-checkpointed region (``regions.REGION`` in their meta) are recomputed
whatever the policy says, in both modes: none of their values may be saved but the region's
outputs that later forward ops read (the next region's input), so the cut saves what eager's
checkpointing keeps, the region's inputs. A random op in a region stays in the forward (its
seed is saved), so the recomputation draws the forward's numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import operator
from collections.abc import Iterable

import networkx as nx
import torch
from torch import fx

from kiln.autograd_aot import rng  # noqa: F401  (defines the kiln_aot ops named below)
from kiln.autograd_aot.mincut import CutProblem, min_cut
from kiln.autograd_aot.mutation import is_view
from kiln.autograd_aot.regions import REGION
from kiln.autograd_aot.symbolic import hint, is_symbolic_value
from kiln.autograd_aot.trace import verify_aten_graph

__all__ = ["PartitionStats", "partition_joint", "recomputable", "saved_bytes"]

log = logging.getLogger(__name__)

aten = torch.ops.aten

_CHEAP = frozenset(
    {
        aten._to_copy,
        aten.clone,
        aten.expand,
        aten.full,
        aten.zeros,
        aten.ones,
        aten.arange,
        aten.scalar_tensor,
        aten.empty,
        aten.full_like,
        aten.zeros_like,
        aten.ones_like,
        aten.empty_like,
        aten.where,
        aten.cat,
        torch.ops.kiln_aot.seeded_random,
    }
)


@dataclasses.dataclass(frozen=True)
class PartitionStats:
    """What the forward saves for the backward, against saving every value it uses.

    ``saved_bytes`` and ``save_all_bytes`` count activations: saved values that
    are not graph inputs (saving an input or parameter costs no extra memory);
    ``saved_input_bytes`` counts the inputs saved.
    """

    saved_bytes: int
    save_all_bytes: int
    saved_input_bytes: int
    num_saved: int
    num_recomputed: int

    def __str__(self) -> str:
        return (
            f"saved {self.num_saved} tensors: {self.saved_bytes} activation bytes "
            f"(save-all: {self.save_all_bytes}) plus {self.saved_input_bytes} bytes of "
            f"inputs; {self.num_recomputed} ops recomputed"
        )


def _is_view_node(node: fx.Node) -> bool:
    return node.op == "call_function" and hasattr(node.target, "_schema") and is_view(node.target)


def _is_input_view(node: fx.Node) -> bool:
    """A graph input or a view of one: saving it keeps no extra memory alive."""
    while _is_view_node(node):
        node = node.all_input_nodes[0]
    return node.op == "placeholder"


def _inputs_for_their_views(
    saved: set[fx.Node], primals: list[fx.Node], mutated: set[fx.Node]
) -> set[fx.Node]:
    """``saved`` with each view of a graph input (a chain of view ops over it alone) replaced
    by the input: the backward makes the view again, for nothing, where the forward would
    return it as an output of its own, which a compiler may store (loopir copied the weight
    of every linear layer, seen through ``t(t(w))``, into a buffer on every step). The
    same memory is kept and the same version counter is checked."""
    inputs = set(primals) - mutated
    out: set[fx.Node] = set()
    for n in saved:
        root = n
        while _is_view_node(root) and len(root.all_input_nodes) == 1:
            root = root.all_input_nodes[0]
        out.add(root if root is not n and root in inputs else n)
    return out


def _activation_bytes(nodes: Iterable[fx.Node]) -> int:
    return int(sum(saved_bytes(n) for n in nodes if not _is_input_view(n)))


def saved_bytes(node: fx.Node) -> float:
    """The bytes a node's value takes (a symbolic size's: one int), or infinity if it is not
    one tensor or size. Symbolic sizes count at their hints (a number would add a guard)."""
    val = node.meta.get("val")
    if is_symbolic_value(val):
        return 8.0
    if not isinstance(val, torch.Tensor):
        return math.inf
    return float(hint(val.numel()) * val.element_size())


def _is_size_op(node: fx.Node) -> bool:
    """A node computing a symbolic size (``sym_size`` and the arithmetic over it): cheap to
    recompute from what holds its sizes, or saved as one int."""
    return is_symbolic_value(node.meta.get("val"))


def _random(node: fx.Node) -> bool:
    if node.target is operator.getitem:
        node = node.all_input_nodes[0]
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def recomputable(node: fx.Node) -> bool:
    """May the backward recompute this node instead of the forward saving it?"""
    if node.op != "call_function":
        return node.op == "get_attr"
    target = node.target
    if target is operator.getitem or _is_size_op(node):
        return True
    if not hasattr(target, "_schema"):  # a higher-order node (control_flow.py): saved
        return False
    tags = getattr(target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags:
        return False
    if torch.Tag.pointwise in tags or is_view(target):
        return True
    return getattr(target, "overloadpacket", None) in _CHEAP


_UNFUSED = frozenset(
    {
        aten.mm,
        aten.bmm,
        aten.addmm,
        aten.baddbmm,
        aten.convolution,
        aten.convolution_backward,
    }
)
"""Library calls: a value they read is stored, whichever graph computes it."""


def materialized_in_backward(node: fx.Node, backward: set[fx.Node]) -> bool:
    """Whether recomputing ``node`` would store it in the backward anyway: a backward
    matrix product or convolution reads it (directly or through views), as a weight
    gradient reads the activation that went into the layer. Saving it then costs memory
    only (the forward stores it for its own product), where recomputing it costs a write
    and a read more per step (Inductor bans that recomputation too)."""
    if _is_view_node(node):
        return False
    todo = [node]
    while todo:
        for user in todo.pop().users:
            if user in backward and getattr(user.target, "overloadpacket", None) in _UNFUSED:
                return True
            if _is_view_node(user):
                todo.append(user)
    return False


def _closure(start: Iterable[fx.Node], step: str) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    todo = list(start)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo.extend(n.users if step == "users" else n.all_input_nodes)
    return seen


def _ancestors(outputs: Iterable[fx.Node], stop: set[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    todo = list(outputs)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in stop:
            todo.extend(n.all_input_nodes)
    return seen


def _extract(
    gm: fx.GraphModule, inputs: list[fx.Node], outputs: list[fx.Node | None]
) -> fx.GraphModule:
    """A new graph computing ``outputs`` from ``inputs`` with ``gm``'s nodes."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        env[n] = graph.placeholder(n.name)
        env[n].meta = dict(n.meta)
    needed = _ancestors([o for o in outputs if o is not None], set(inputs))
    for n in gm.graph.nodes:
        if n in needed and n not in env:
            if n.op == "placeholder":
                msg = f"partition bug: {n.name} is needed but not an input"
                raise AssertionError(msg)
            env[n] = graph.node_copy(n, env.__getitem__)
    graph.output(tuple(None if o is None else env[o] for o in outputs))
    graph.eliminate_dead_code()
    out = fx.GraphModule(gm, graph)
    verify_aten_graph(out)
    return out


def _recompute_late(gm: fx.GraphModule) -> None:
    """Move each recomputed op of a checkpointed region to just before its first user, so
    the backward rebuilds a region when its gradients need it, as eager's checkpointing does,
    rather than every region's values at once (extraction keeps the joint graph's order)."""
    for node in reversed(list(gm.graph.nodes)):
        if REGION not in node.meta or node.op != "call_function" or not node.users:
            continue
        first = node.next
        while first not in node.users:
            first = first.next
        if first is not node.next:
            first.prepend(node)
    gm.recompile()


@dataclasses.dataclass
class _Joint:
    """A joint graph's nodes sorted by role."""

    primals: list[fx.Node]
    tangents: list[fx.Node]
    forward_outputs: list[fx.Node]
    grads: list[fx.Node | None]
    tangent_side: set[fx.Node]  # computed from a tangent: backward only
    relevant: list[fx.Node]  # needed by some output, in graph order

    @staticmethod
    def of(gm: fx.GraphModule, num_primals: int, num_forward_outputs: int) -> _Joint:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        outs = list(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        needed = _ancestors([o for o in outs if isinstance(o, fx.Node)], set())
        return _Joint(
            primals=placeholders[:num_primals],
            tangents=placeholders[num_primals:],
            forward_outputs=outs[:num_forward_outputs],
            grads=outs[num_forward_outputs:],
            tangent_side=_closure(placeholders[num_primals:], "users"),
            relevant=[n for n in gm.graph.nodes if n in needed],
        )

    @property
    def backward_outputs(self) -> list[fx.Node]:
        return [g for g in self.grads if g is not None]

    def save_all(self) -> set[fx.Node]:
        """Every forward value the backward uses."""
        bw_needed = _ancestors(self.backward_outputs, set())
        bw_outs = set(self.backward_outputs)
        return {
            n
            for n in self.relevant
            if n not in self.tangent_side
            and n.op != "get_attr"
            and (n in bw_outs or any(u in self.tangent_side and u in bw_needed for u in n.users))
        }

    def checkpointed(self) -> set[fx.Node]:
        """The forward ops of checkpointed regions that the backward recomputes and that
        must not be saved: all but random ones and the region's outputs (values a forward op
        outside the region reads, or the graph returns), which the forward computes and
        saves, as eager's checkpointing keeps the next region's input."""
        fw_needed = _ancestors(self.forward_outputs, set())
        outputs = set(self.forward_outputs)
        return {
            n
            for n in self.relevant
            if n.meta.get(REGION) is not None
            and n not in self.tangent_side
            and not _random(n)
            and n not in outputs
            and not any(u in fw_needed and u.meta.get(REGION) != n.meta[REGION] for u in n.users)
        }

    def min_cut(self, overwritten: set[fx.Node], *, policy: bool = True) -> set[fx.Node]:
        """The cheapest values to save, recomputing what the policy allows (with ``policy``
        False: only checkpointed regions, and backward-only values, are recomputed)."""
        interior = self.checkpointed()
        unsavable = overwritten | interior | {n for n in self.relevant if n.op == "get_attr"}
        fw_needed = _ancestors(self.forward_outputs, set())
        forward = {
            n
            for n in self.relevant
            if n not in self.tangent_side
            and n not in interior
            and (
                REGION in n.meta
                or (not policy and n in fw_needed)
                or not recomputable(n)
                or materialized_in_backward(n, self.tangent_side)
            )
        }
        problem = CutProblem(
            nodes=self.relevant,
            cost=lambda n: math.inf if n in unsavable else saved_bytes(n),
            forward_only=forward | set(self.primals),
            backward_only={n for n in self.relevant if n in self.tangent_side},
            backward_outputs=self.backward_outputs,
        )
        return min_cut(problem)


def partition_joint(
    gm: fx.GraphModule,
    num_primals: int,
    num_forward_outputs: int,
    *,
    mincut: bool = True,
    mutated_inputs: Iterable[int] = (),
) -> tuple[fx.GraphModule, fx.GraphModule, PartitionStats]:
    """Forward ``(*primals) -> (*outputs, *saved)``; backward ``(*saved, *tangents) -> grads``.

    Inputs in ``mutated_inputs`` are never saved: the runtime overwrites them after
    the forward, so the backward must get their old values from a copy.
    """
    joint = _Joint.of(gm, num_primals, num_forward_outputs)
    save_all = joint.save_all()
    saved = save_all
    regions = any(REGION in n.meta for n in joint.relevant)
    if mincut or regions:
        overwritten = {joint.primals[i] for i in mutated_inputs}
        try:
            saved = joint.min_cut(overwritten, policy=mincut)
            saved = _inputs_for_their_views(saved, joint.primals, overwritten)
        except nx.NetworkXUnbounded:
            log.warning("no finite min cut (a needed value cannot be saved); saving all")
    saved_list = [n for n in gm.graph.nodes if n in saved]
    fw = _extract(gm, joint.primals, [*joint.forward_outputs, *saved_list])
    bw = _extract(gm, saved_list + joint.tangents, joint.grads)
    if regions:
        _recompute_late(bw)
    fw_ops = {n.name for n in fw.graph.nodes if n.op == "call_function"}
    stats = PartitionStats(
        saved_bytes=_activation_bytes(saved_list),
        save_all_bytes=_activation_bytes(save_all),
        saved_input_bytes=int(sum(saved_bytes(n) for n in saved_list if _is_input_view(n))),
        num_saved=len(saved_list),
        num_recomputed=sum(
            1 for n in bw.graph.nodes if n.op == "call_function" and n.name in fw_ops
        ),
    )
    return fw, bw, stats
