"""A graph compiled under DDP, split at its gradient buckets, as TorchDynamo's DDPOptimizer does.

One compiled graph has one backward: every parameter's gradient appears when it ends, so
DDP's hooks, which all-reduce a bucket once all its gradients are in, can start no
all-reduce before the whole backward is done, and communication does not overlap compute.
Split into consecutive pieces, each compiled on its own (its own forward and backward
through autograd_aot), the backward runs piece by piece from the last: when one ends, the
gradients of the parameters first used in it are final, their bucket's all-reduce starts,
and the next piece's backward runs meanwhile.

The pieces follow DDP's buckets (``kiln.capture.parallel_modules.active_ddp_buckets``):
walking the graph from its output back, each parameter counts toward the current piece at
its first use in the forward (where its gradient is complete in the backward), its bytes
as DDP counts them; a piece is closed once its parameters fill the bucket size (the first,
the last gradients', has DDP's first-bucket size) and it has an output a later piece reads.
A leading piece with no parameters joins the next. A graph of one bucket is not split.

The pieces are compiled on the graph's first call, one after another with the real values
the previous pieces computed as their example inputs (the frontend's compile of each runs
per size afterwards, as any graph's does). ``kiln.stats().ddp_graph_pieces`` counts the
pieces of the graphs compiled under DDP (one for a graph that is not split).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.fx.passes.split_module import split_module

from kiln.capture import counters
from kiln.capture.parallel_modules import BucketCaps, active_ddp_buckets

__all__ = ["bucket_of_nodes", "compile_under_ddp"]

log = logging.getLogger(__name__)
CompileFn = Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]]


def _param_bytes(value: Any, caps: BucketCaps) -> int:
    if not isinstance(value, torch.nn.Parameter) or not value.requires_grad:
        return 0
    if id(value) in caps.ignored:
        return 0
    return value.numel() * value.element_size()


def bucket_of_nodes(
    gm: fx.GraphModule, example_inputs: Sequence[Any], caps: BucketCaps
) -> dict[fx.Node, int]:
    """Each non-placeholder node's piece (0 first in the forward), from DDP's bucket sizes."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    order = {n: i for i, n in enumerate(nodes)}
    size_at: dict[fx.Node, int] = {}  # a parameter's bytes, at the node first using it
    for node, value in zip(placeholders, example_inputs, strict=False):
        size = _param_bytes(value, caps)
        if size and node.users:
            first = min(node.users, key=order.__getitem__)
            size_at[first] = size_at.get(first, 0) + size
    # built from the output back: pieces[0] is the last piece of the forward
    pieces: list[list[fx.Node]] = [[]]
    sizes = [0]
    for node in reversed(nodes):
        if node.op in ("output", "placeholder"):
            continue
        cap = caps.first if len(pieces) == 1 else caps.rest
        if sizes[-1] >= cap and _has_output(pieces[-1]):
            pieces.append([])
            sizes.append(0)
        pieces[-1].append(node)
        sizes[-1] += size_at.get(node, 0)
    if len(pieces) > 1 and sizes[-1] == 0:  # a preamble without parameters joins the next
        pieces[-2].extend(pieces.pop())
    last = len(pieces) - 1
    return {n: last - i for i, piece in enumerate(pieces) for n in piece}


def _has_output(piece: list[fx.Node]) -> bool:
    """Whether a piece (its nodes from the output back) has a value read outside it: a piece
    without one would be a graph with no output."""
    inside: set[fx.Node] = set()
    for node in piece:
        inside.add(node)
        if any(user not in inside for user in node.users):
            return True
    return False


def compile_under_ddp(
    gm: fx.GraphModule, example_inputs: Sequence[Any], compile_fn: CompileFn
) -> Callable[..., Any]:
    """``compile_fn`` of ``gm``, split into pieces at the gradient buckets of the DDP module
    whose forward runs now, if one does and the graph has more than one bucket."""
    caps = active_ddp_buckets()
    if caps is None:
        return compile_fn(gm, example_inputs)
    partition = bucket_of_nodes(gm, example_inputs, caps)
    split: fx.GraphModule | None = None
    if max(partition.values(), default=0) > 0:
        try:
            split = split_module(gm, gm, partition.__getitem__, keep_original_order=True)
        except Exception as e:  # a graph split_module cannot cut: compiled whole, no overlap
            log.warning("kiln: a graph under DDP compiles unsplit: %s: %s", type(e).__name__, e)
    pieces = max(partition.values()) + 1 if split is not None else 1
    counters.bump("stats", "ddp_graph_pieces", pieces)
    return compile_fn(gm, example_inputs) if split is None else _Pieces(split, compile_fn)


class _Pieces:
    """The split graph: its pieces compiled on the first call, then run in order."""

    def __init__(self, split: fx.GraphModule, compile_fn: CompileFn) -> None:
        self.split = split
        # the frontend's compile, dropped once used: the emitted code keeps this object, and a
        # compiled function reached from it would never be freed (see api._compile_graph)
        self.compile_fn: CompileFn | None = compile_fn
        self.lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if self.compile_fn is not None:
            with self.lock:
                compile_fn = self.compile_fn
                if compile_fn is not None:
                    out = _CompilingInterpreter(self.split, compile_fn).run(*args)
                    self.compile_fn = None
                    return out
        return self.split(*args)


class _CompilingInterpreter(fx.Interpreter):
    """Runs the split graph once, compiling each piece with the real values it is called on
    and putting the compiled piece in its place."""

    def __init__(self, module: fx.GraphModule, compile_fn: CompileFn) -> None:
        super().__init__(module)
        self.compile_fn = compile_fn

    def call_module(self, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        piece = self.fetch_attr(target)
        assert isinstance(piece, fx.GraphModule) and not kwargs
        single = _tuple_output(piece)
        compiled = _Piece(self.compile_fn(piece, list(args)), single)
        setattr(self.module, target, compiled)
        return compiled(*args)


def _tuple_output(piece: fx.GraphModule) -> bool:
    """Make ``piece`` return a tuple (the backends want a graph's outputs as a sequence);
    whether it returned a single value."""
    output = next(n for n in piece.graph.nodes if n.op == "output")
    single = not isinstance(output.args[0], tuple | list)
    if single:
        output.args = ((output.args[0],),)
    piece.recompile()
    return single


class _Piece(torch.nn.Module):
    """A compiled piece where the split graph calls its submodule (a single output unwrapped,
    as the split graph reads it)."""

    def __init__(self, compiled: Callable[..., Any], single: bool) -> None:
        super().__init__()
        self.compiled = compiled
        self.single = single

    def forward(self, *args: Any) -> Any:
        out = self.compiled(*args)
        return out[0] if self.single else out
