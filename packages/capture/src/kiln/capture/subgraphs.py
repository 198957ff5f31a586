"""Cutting a function's traced ops out of the frame's graph into a graph of their own.

Higher-order constructs (``torch.cond``, ``torch.while_loop``, torch.func transforms) trace
their function inline, as any call, then take the ops it recorded out into a subgraph and
roll the frame's graph back; one node calling the subgraph takes their place. Values the
function read from outside its arguments (closures, parameters, earlier results) become
inputs of the subgraph after the arguments, passed by that node.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import torch
from torch import fx

from kiln.capture.values.tensor import TensorValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["cut"]


def cut(
    tr: Tracer,
    before: Collection[fx.Node],
    entries: Sequence[fx.Node],
    outputs: Sequence[fx.Node],
    known: Sequence[fx.Node] = (),
) -> tuple[fx.GraphModule, list[TensorValue]]:
    """A graph of the ops recorded since ``before`` (the graph's nodes then), returning
    ``outputs``: its inputs are ``entries`` (an entry given twice is an unused input the
    second time), then ``known``, then the other older values the ops read, which are
    returned, for the node that calls the graph to pass."""
    made = [n for n in tr.out.graph.nodes if n not in before and n.op != "placeholder"]
    inside = set(made)
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, n in enumerate([*entries, *known]):
        if n in env:
            sub.placeholder(f"unused{i}")
            continue
        env[n] = sub.placeholder(f"arg{i}")
        env[n].meta["val"] = n.meta.get("val")
    body = [n for n in made if n not in env]
    lifted: list[TensorValue] = []
    for n in [*body, *outputs]:
        for used in n.all_input_nodes if n in inside else [n]:
            if used not in env and used not in inside:
                env[used] = sub.placeholder(f"lifted{len(lifted)}")
                env[used].meta["val"] = used.meta["val"]
                lifted.append(TensorValue(used, used.meta["val"]))
    for n in body:
        env[n] = sub.node_copy(n, env.__getitem__)
    sub.output(tuple(env[o] for o in outputs))
    gm = fx.GraphModule(torch.nn.Module(), sub)
    gm.graph.lint()
    return gm, lifted
