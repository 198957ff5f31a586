"""The min-cut algorithm on hand-built graphs."""

import math

import torch
from torch import fx

from kiln.autograd_aot.mincut import CutProblem, min_cut


def _node_graph():
    g = fx.Graph()
    x = g.placeholder("x")
    big = g.call_function(torch.ops.aten.expand.default, (x, [100]))
    small = g.call_function(torch.ops.aten.sum.default, (big,))
    t = g.placeholder("t")
    use = g.call_function(torch.ops.aten.mul.Tensor, (small, t))
    return [x, big, small, t, use], {x: 4, big: 400, small: 4, t: 4, use: 4}


def test_cut_picks_cheapest_value():
    nodes, size = _node_graph()
    x, big, small, t, use = nodes
    problem = CutProblem(
        nodes=nodes,
        cost=lambda n: size[n],
        forward_only={x, small},  # the reduction may not be recomputed
        backward_only={t, use},
        backward_outputs=[use],
    )
    assert min_cut(problem) == {small}


def test_cut_prefers_recomputing_from_input():
    nodes, size = _node_graph()
    x, big, small, t, use = nodes
    problem = CutProblem(
        nodes=nodes,
        cost=lambda n: size[n],
        forward_only={x},
        backward_only={t, use},
        backward_outputs=[use],
    )
    saved = min_cut(problem)
    assert saved in ({x}, {small})
    assert sum(size[n] for n in saved) == 4


def test_unsavable_nodes_are_never_cut():
    nodes, size = _node_graph()
    x, big, small, t, use = nodes
    problem = CutProblem(
        nodes=nodes,
        cost=lambda n: math.inf if n is small else size[n],
        forward_only={x},
        backward_only={t, use},
        backward_outputs=[use],
    )
    assert min_cut(problem) == {x}
