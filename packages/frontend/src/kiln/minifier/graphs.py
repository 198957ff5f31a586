"""Graph surgery for the minifier: graphs as code plus inputs, and the shrinking search.

A failing graph is kept as a GraphModule whose every value comes from a placeholder (weights
and buffers become inputs), so a graph is whole once its code and its inputs are written down.
The search is delta debugging over the graph's nodes: a candidate keeps one output, or turns a
set of nodes into new inputs (their eager values); what no output needs is dropped. A candidate
is kept when the failure still occurs on it, and the search stops when no candidate is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from kiln.loopir.wrapper import clone_strided

__all__ = ["clone_inputs", "compute_nodes", "minify", "node_values", "normalize", "rebuild"]

log = logging.getLogger("kiln.frontend.minifier")

Fails = Callable[[fx.GraphModule, list[Any]], bool]


def normalize(gm: fx.GraphModule, inputs: Sequence[Any]) -> tuple[fx.GraphModule, list[Any]]:
    """A copy of ``gm`` whose ``get_attr`` values are inputs too (appended to ``inputs``)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    values = list(inputs)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = graph.placeholder(node.name)
            env[node].meta = dict(node.meta)
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            env[node] = graph.placeholder(node.name)
            value: Any = gm
            for part in str(node.target).split("."):
                value = getattr(value, part)
            values.append(value.detach() if isinstance(value, torch.Tensor) else value)
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "get_attr"):
            env[node] = graph.node_copy(node, lambda n: env[n])
    return fx.GraphModule(torch.nn.Module(), graph), values


def compute_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes that compute something (neither inputs nor the output)."""
    return [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


def node_values(gm: fx.GraphModule, inputs: Sequence[Any]) -> dict[str, Any]:
    """Every node's eager value on ``inputs``, by node name."""
    values: dict[str, Any] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            values[n.name] = result
            return result

    with torch.no_grad():
        Recorder(gm).run(*clone_inputs(inputs))
    return values


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    """Copies of the tensor inputs, each laid out as its original (a compiled graph's kernels
    index them with the original's strides)."""
    return [clone_strided(t) if isinstance(t, torch.Tensor) else t for t in inputs]


def rebuild(
    gm: fx.GraphModule,
    inputs: Sequence[Any],
    values: dict[str, Any],
    cut: set[str],
    outputs: list[str] | None = None,
) -> tuple[fx.GraphModule, list[Any]]:
    """``gm`` with the nodes named in ``cut`` read as new inputs (their ``values``), returning
    ``outputs`` (node names; None: ``gm``'s own), less what no output needs."""
    nodes = list(gm.graph.nodes)
    out_node = nodes[-1]
    by_name = {n.name: n for n in nodes}
    roots = [by_name[o] for o in outputs] if outputs is not None else out_node.all_input_nodes
    live: set[fx.Node] = set(roots)
    for node in reversed(nodes):
        if node in live and node.name not in cut and node.op != "placeholder":
            live.update(node.all_input_nodes)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    new_inputs: list[Any] = []
    placeholders = [n for n in nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        if node in live:
            env[node] = graph.placeholder(node.name)
            new_inputs.append(inputs[i])
    for node in nodes:
        if node in live and node.name in cut and node.op != "placeholder":
            env[node] = graph.placeholder(node.name)
            new_inputs.append(values[node.name])
    for node in nodes:
        if node in live and node not in env and node.op not in ("placeholder", "output"):
            env[node] = graph.node_copy(node, lambda n: env[n])
    if outputs is not None:
        graph.output(tuple(env[by_name[o]] for o in outputs))
    else:
        graph.output(fx.map_arg(out_node.args[0], lambda n: env[n]))
    return fx.GraphModule(torch.nn.Module(), graph), new_inputs


class _Search:
    """One minification: the current graph, its inputs and values, and a budget of checks."""

    def __init__(self, gm: fx.GraphModule, inputs: list[Any], fails: Fails, budget: int) -> None:
        self.gm, self.inputs, self.fails, self.budget = gm, inputs, fails, budget
        self.values = node_values(gm, inputs)

    def attempt(self, cut: set[str], outputs: list[str] | None = None) -> bool:
        """Keep the candidate when it is smaller and still fails."""
        if self.budget <= 0:
            return False
        try:
            gm, inputs = rebuild(self.gm, self.inputs, self.values, cut, outputs)
        except Exception:
            return False
        if _size(gm) >= _size(self.gm):
            return False
        self.budget -= 1
        if not self.fails(gm, inputs):
            return False
        self.gm, self.inputs = gm, inputs
        self.values = node_values(gm, inputs)
        return True

    def one_output(self) -> bool:
        """Return one tensor the graph computes, the earliest whose graph still fails."""
        tensors = [n.name for n in compute_nodes(self.gm) if _is_tensor(self.values.get(n.name))]
        return any(self.attempt(set(), [name]) for name in tensors)

    def cut_chunks(self) -> bool:
        """Delta debugging: turn chunks of nodes (halving in size) into inputs."""
        changed = False
        names = [n.name for n in compute_nodes(self.gm) if _is_tensor(self.values.get(n.name))]
        size = max(len(names) // 2, 1)
        while size >= 1 and names:
            for start in range(0, len(names), size):
                if self.attempt(set(names[start : start + size])):
                    changed = True
            names = [n.name for n in compute_nodes(self.gm) if _is_tensor(self.values.get(n.name))]
            if size == 1:
                break
            size //= 2
        return changed


def _size(gm: fx.GraphModule) -> tuple[int, int]:
    """Nodes, then outputs: a candidate is kept only when smaller by this measure."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return len(gm.graph.nodes), len(out.all_input_nodes)


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def minify(
    gm: fx.GraphModule, inputs: list[Any], fails: Fails, budget: int = 200
) -> tuple[fx.GraphModule, list[Any]]:
    """The smallest graph the search finds on which ``fails`` still holds."""
    search = _Search(gm, inputs, fails, budget)
    while search.one_output() | search.cut_chunks():
        pass
    log.info(
        "minified to %d nodes (%d checks left of %d)",
        len(search.gm.graph.nodes),
        search.budget,
        budget,
    )
    return search.gm, search.inputs
