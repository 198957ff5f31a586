"""The min-cut algorithm that picks what a forward graph saves for its backward.

Each node ``n`` becomes an edge ``n_in -> n_out`` whose capacity is the cost of
saving ``n`` (its bytes; infinite when it cannot be saved). Data edges are
infinite. The source feeds what must run in the forward (graph inputs, ops too
costly to recompute); what must run in the backward (everything downstream of
a tangent, and the backward's outputs) drains to the sink. A minimum cut then
separates the forward from the backward across the cheapest set of saved
values; everything on the sink side is recomputed in the backward.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import networkx as nx
from torch import fx

__all__ = ["CutProblem", "min_cut"]


@dataclasses.dataclass
class CutProblem:
    """The inputs of :func:`min_cut`, chosen by the partitioning policy."""

    nodes: list[fx.Node]  # the joint graph's nodes that matter, in graph order
    cost: Callable[[fx.Node], float]  # bytes to save a node, math.inf if it cannot be
    forward_only: set[fx.Node]  # must be computed in the forward (inputs, banned recomputation)
    backward_only: set[fx.Node]  # must be computed in the backward (tangent-dependent)
    backward_outputs: Iterable[fx.Node]  # values the backward returns


def min_cut(problem: CutProblem) -> set[fx.Node]:
    """The nodes to save: the cheapest set that cuts the forward from the backward.

    Raises ``networkx.NetworkXUnbounded`` when no finite cut exists.
    """
    graph = nx.DiGraph()
    members = set(problem.nodes)
    for node in problem.nodes:
        if node in problem.backward_only:
            graph.add_edge(f"{node.name}_in", "sink", capacity=math.inf)
        elif node in problem.forward_only:
            graph.add_edge("source", f"{node.name}_in", capacity=math.inf)
        graph.add_edge(f"{node.name}_in", f"{node.name}_out", capacity=problem.cost(node))
        for user in node.users:
            if user in members:
                graph.add_edge(f"{node.name}_out", f"{user.name}_in", capacity=math.inf)
    for node in problem.backward_outputs:
        graph.add_edge(f"{node.name}_out", "sink", capacity=math.inf)
    if "source" not in graph or "sink" not in graph:
        return set()
    _, (reachable, _) = nx.minimum_cut(graph, "source", "sink")
    return {
        n for n in problem.nodes if f"{n.name}_in" in reachable and f"{n.name}_out" not in reachable
    }
