"""Checkpointed regions: carrying capture's marks from torch-level nodes to ATen nodes.

Capture marks the ops of an activation-checkpointed region with ``meta["kiln_recompute"]``
(a region id). The torch-level graph is run under the ATen tracer by an interpreter that
names the region of the node it runs (:data:`current_region`), and the tracer copies it onto
every ATen node recorded meanwhile, decompositions included; the partitioner then recomputes
those nodes in the backward instead of saving them. The backward traced by autograd runs
outside any node, so its ops are never marked.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch._decomp
from torch import fx

from kiln.autograd_aot.rng import random_decompositions

__all__ = [
    "REGION",
    "MarkingInterpreter",
    "call_marked",
    "current_region",
    "has_regions",
    "random_in_region",
]

REGION = "kiln_recompute"
"""The node meta key: the id of the checkpointed region the node belongs to."""

current_region: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "kiln_recompute_region", default=None
)


@functools.cache
def random_in_region() -> dict[Any, Callable[..., Any]]:
    """Decompositions the tracer applies to random ops inside a region, whatever its table:
    into a saved seed and a pure draw from it (``rng.py``), so the backward recomputes the
    forward's numbers instead of the forward saving them (a backend that lowers
    ``bernoulli`` itself takes it out of its table)."""
    table = random_decompositions()
    dropout = torch.ops.aten.native_dropout.default
    table[dropout] = torch._decomp.decomposition_table[dropout]
    return table


def has_regions(gm: torch.nn.Module) -> bool:
    """Whether a torch-level graph holds checkpointed regions."""
    graph = getattr(gm, "graph", None)
    return isinstance(graph, fx.Graph) and any(REGION in n.meta for n in graph.nodes)


class MarkingInterpreter(fx.Interpreter):
    def run_node(self, n: fx.Node) -> Any:
        token = current_region.set(n.meta.get(REGION))
        try:
            return super().run_node(n)
        finally:
            current_region.reset(token)


class _Marked(torch.nn.Module):
    """Runs ``gm`` node by node, so the tracer knows each op's region; its state is ``gm``'s
    (under ``gm.``), so ``functional_call`` swaps it as it would ``gm``'s."""

    def __init__(self, gm: fx.GraphModule, interpreter: type[fx.Interpreter]) -> None:
        super().__init__()
        self.gm = gm
        self.interpreter = interpreter

    def forward(self, *args: Any) -> Any:
        return self.interpreter(self.gm).run(*args)


def call_marked(
    gm: fx.GraphModule,
    state: Mapping[str, torch.Tensor],
    args: Sequence[Any],
    interpreter: type[fx.Interpreter] = MarkingInterpreter,
) -> Any:
    """``functional_call(gm, state, args)``, naming each node's region while it runs (with
    ``interpreter``: a subclass of the marking one that runs some nodes its own way)."""
    prefixed = {f"gm.{name}": value for name, value in state.items()}
    return torch.func.functional_call(_Marked(gm, interpreter), prefixed, tuple(args))
