"""Shape expressions as fx nodes (kiln.capture.shapes.materialize)."""

from __future__ import annotations

import operator

import sympy
import torch
from torch import fx

from kiln.capture.shapes.exprs import FloorDiv
from kiln.capture.shapes.materialize import CannotMaterialize, Materializer

S0 = sympy.Symbol("s0", integer=True, positive=True)
S1 = sympy.Symbol("s1", integer=True, positive=True)


def _materializer() -> tuple[fx.Graph, Materializer]:
    graph = fx.Graph()
    x = graph.placeholder("x")
    dims = {S0: 0, S1: 1}
    return graph, Materializer(
        lambda s: graph.call_function(torch.ops.aten.sym_size.int, (x, dims[s])),
        lambda target, args, expr: graph.call_function(target, args),
    )


def test_expressions_become_nodes_once() -> None:
    graph, m = _materializer()
    node = m(FloorDiv(S0 * S1, 4) + 1)
    assert m(FloorDiv(S0 * S1, 4) + 1) is node
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.sym_size.int) == 2
    assert {operator.mul, operator.floordiv, operator.add} <= set(targets)
    assert m(sympy.Integer(3)) == 3


def test_a_node_erased_by_a_rollback_is_built_again() -> None:
    graph, m = _materializer()
    first = m(S0 * 4)
    for n in reversed(list(graph.nodes)):
        if n.op != "placeholder":
            graph.erase_node(n)
    again = m(S0 * 4)
    assert again is not first and again in graph.nodes


def test_a_fraction_has_no_node_form() -> None:
    _, m = _materializer()
    try:
        m(S0 / 3)
    except CannotMaterialize:
        return
    raise AssertionError("S0 / 3 was materialized")
