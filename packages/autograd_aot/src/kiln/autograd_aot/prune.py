"""Backward graphs for the outputs that got a gradient, and the saved values users can reach.

Eager's backward runs only the autograd nodes a gradient reaches: an output the loss does
not use costs nothing, and what its nodes saved is neither read nor version-checked. The
compiled backward takes a tangent for every differentiable output; one that got no gradient
would be a zero tensor, and the backward would still read the values saved for it (which the
user may have changed in place since: eager would not mind) and multiply them by zero (an
infinity there makes NaN where eager has nothing). :func:`prune_backward` cuts the backward
graph down to the present tangents, so it reads and computes only what eager's would.

:func:`exposed_saved` names the saved values the user can reach (a returned output or an
input, or a view of one): the runtime checks those itself, only where the backward it runs
reads them, since autograd's own check of saved tensors would fire whatever ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from kiln.autograd_aot.mutation import is_view
from kiln.autograd_aot.symbolic import SymbolReader
from kiln.autograd_aot.trace import verify_aten_graph
from kiln.capture.meta import FakeTensor

__all__ = ["exposed_saved", "prune_backward"]

aten = torch.ops.aten
_ACCUMULATE = frozenset({aten.add.Tensor, aten.sub.Tensor})
"""Where autograd sums the gradient contributions of several uses (``add``), or a backward
formula subtracts one (``sub``): one operand missing, the other is the sum."""


def _view_root(node: fx.Node) -> fx.Node:
    while (
        node.op == "call_function"
        and hasattr(node.target, "_schema")
        and is_view(node.target)
        and node.all_input_nodes
    ):
        node = node.all_input_nodes[0]
    return node


def exposed_saved(fw: fx.GraphModule, num_user_outputs: int, num_saved: int) -> list[int]:
    """Which of the forward's saved values (by position) are, or view, an input or an output
    the user is given: the user may change those in place before the backward runs."""
    out = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    saved = list(out[len(out) - num_saved :]) if num_saved else []
    roots = {_view_root(n) for n in out[:num_user_outputs] if isinstance(n, fx.Node)}
    return [
        i
        for i, n in enumerate(saved)
        if isinstance(n, fx.Node)
        and isinstance(n.meta.get("val"), torch.Tensor)  # not a saved size
        and (_view_root(n).op == "placeholder" or _view_root(n) in roots)
    ]


def prune_backward(
    bw: fx.GraphModule, num_saved: int, present: Sequence[int], symbols: Sequence[Any] = ()
) -> tuple[fx.GraphModule, list[int], list[int]]:
    """``bw`` (``(*saved, *tangents) -> grads``) for the tangents at positions ``present``
    only: the graph ``(*used saved, *present tangents) -> live grads``, the saved positions it
    reads and the grad positions it returns (the others get no gradient, as in eager).

    A node computed only from missing tangents is never run by eager's backward: it goes.
    Where it meets a live value in a sum, the sum is the live value; anywhere else (a node
    fed by several outputs' gradients at once) it is a zero tensor, as eager hands such a
    node for an output without a gradient.

    ``symbols`` (the forward's size symbols, as SymInts) are taken as extra inputs after the
    tangents, so a zero tensor's symbolic size can be read where no kept input carries it
    (the missing tangent alone did)."""
    placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"]
    tangents = placeholders[num_saved:]
    keep = {tangents[i] for i in present}
    from_tangent: set[fx.Node] = set(tangents)
    from_present: set[fx.Node] = set(keep)
    for n in bw.graph.nodes:
        if n.op in ("call_function", "call_method"):
            inputs = n.all_input_nodes
            if any(i in from_tangent for i in inputs):
                from_tangent.add(n)
            if any(i in from_present for i in inputs):
                from_present.add(n)
    dead = from_tangent - from_present

    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for p in placeholders:
        if p in dead:
            continue
        env[p] = graph.placeholder(p.name)
        env[p].meta = dict(p.meta)

    extra = []
    for k, sym in enumerate(symbols):
        node = graph.placeholder(f"symbol_{k}")
        node.meta["val"] = sym
        extra.append((node, sym))
    # symbolic sizes of the zeros are read from the inputs the pruned graph keeps
    sizes = SymbolReader(
        graph, lambda: [(env[p], p.meta.get("val")) for p in placeholders if p in env] + extra
    )

    def arg(a: fx.Node) -> fx.Node:
        if a in env:
            return env[a]
        val = a.meta["val"]
        shape = [sizes.node_for(n) for n in val.shape]
        zeros = graph.call_function(
            aten.zeros.default, (shape,), {"dtype": val.dtype, "device": val.device}
        )
        zeros.meta["val"] = FakeTensor(
            torch.empty(val.shape, dtype=val.dtype, device="meta"), val.device
        )
        env[a] = zeros
        return zeros

    output: fx.Node | None = None
    for n in bw.graph.nodes:
        if n.op == "placeholder" or n in dead:
            continue
        if n.op == "output":
            output = n
            continue
        live = _sum_without_dead(n, dead)
        env[n] = env[live] if live is not None else graph.node_copy(n, arg)
    assert output is not None and isinstance(output.args[0], (tuple, list))
    grads = list(output.args[0])
    returned = [i for i, g in enumerate(grads) if isinstance(g, fx.Node) and g not in dead]
    graph.output(tuple(env[grads[i]] for i in returned))
    graph.eliminate_dead_code()
    used = []
    for i, p in enumerate(placeholders[:num_saved]):
        if env[p].users:
            used.append(i)
        else:
            graph.erase_node(env[p])
    gm = fx.GraphModule(bw, graph)
    verify_aten_graph(gm)
    return gm, used, returned


def _sum_without_dead(n: fx.Node, dead: set[fx.Node]) -> fx.Node | None:
    """The live operand of a sum ``n`` whose other operand is dead, when it is the whole
    result (same shape and dtype: no broadcast or promotion the missing term would bring)."""
    if n.target not in _ACCUMULATE or len(n.args) != 2 or n.kwargs.get("alpha", 1) != 1:
        return None
    a, b = n.args
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return None
    if b in dead and a not in dead:
        live = a
    elif a in dead and b not in dead and n.target is aten.add.Tensor:
        live = b
    else:
        return None
    mine, theirs = n.meta["val"], live.meta["val"]
    if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
        return None
    return live
