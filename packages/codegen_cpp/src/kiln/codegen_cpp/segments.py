"""Split a reduction kernel's nodes into loops over ``rindex``.

Inside one ``xindex`` iteration, consecutive ``"xr"`` nodes share a loop over
``rindex`` (a :class:`Segment`) unless one reads a reduction the open loop is
still accumulating: that read needs the finished value, so a new loop starts
after the first one's results are stored (softmax: max, then sum of exp, then
the normalised output). ``"x"`` nodes run between loops. Which buffers a node
reads is found by running its body under :class:`_ReadCollector`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.codegen_cpp.reductions import Accumulator
from kiln.loopir.kernel import RINDEX, XINDEX, KernelNode
from kiln.loopir.ops import BINARY_OPS, UNARY_OPS
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["Segment", "load_indices", "reads_of", "split_segments"]


class Segment:
    """The nodes of one ``rindex`` loop and the reductions it accumulates.

    The loop body is generated once per variant (vector, then scalar tail); the
    n-th reduction of each pass is the same accumulator, so passes are counted.
    """

    def __init__(self, nodes: list[KernelNode]) -> None:
        self.nodes = nodes
        self.row_lanes = False  # lanes are rows (xindex), the rindex loop is scalar
        self.accumulators: list[Accumulator] = []
        self.final_stores: list[str] = []
        self._pass = 0
        self._position = 0

    def reset(self) -> None:
        """Forget a pass that failed (its accumulators and stores)."""
        self.accumulators.clear()
        self.final_stores.clear()
        self._pass = 0

    def start_pass(self) -> None:
        self._pass += 1
        self._position = 0

    def accumulator(self, make: Callable[[], Accumulator]) -> Accumulator:
        """The accumulator of the next reduction in this pass (made on the first pass)."""
        if self._position == len(self.accumulators):
            self.accumulators.append(make())
        acc = self.accumulators[self._position]
        self._position += 1
        return acc

    def add_store(self, line: str) -> None:
        if self._pass == 1:
            self.final_stores.append(line)


class _ReadCollector:
    """An ``ops`` handler that only records what is loaded, and where."""

    def __init__(self) -> None:
        self.reads: set[str] = set()
        self.indices: list[sympy.Expr] = []
        self._ids = itertools.count()

    def load(self, name: str, index: sympy.Expr) -> None:
        self.reads.add(name)
        self.indices.append(index)

    def reduction(self, dtype: torch.dtype, src: torch.dtype, rtype: str, value: Any) -> Any:
        return (None, None, None) if rtype == "welford_reduce" else None

    def indirect_indexing(self, x: Any, size: sympy.Expr, check: bool = True) -> sympy.Symbol:
        return sympy.Symbol(f"indirect{next(self._ids)}", integer=True, nonnegative=True)

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> Any:
        return body()

    def __getattr__(self, name: str) -> Callable[..., None]:
        known = {"store", "store_reduction", "index_expr", "where", "to_dtype", "constant"}
        known |= {"load_seed", "rand", "randn"}
        if name in known or name in UNARY_OPS or name in BINARY_OPS:
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def _collect(node: KernelNode) -> _ReadCollector:
    collector = _ReadCollector()
    with set_ops_handler(collector):
        node.body(XINDEX, RINDEX if node.mode == "xr" else None)
    return collector


def reads_of(node: KernelNode) -> set[str]:
    """The buffers ``node``'s body loads."""
    return _collect(node).reads


def load_indices(node: KernelNode) -> list[sympy.Expr]:
    """The index of every load in ``node``'s body."""
    return _collect(node).indices


def split_segments(nodes: Sequence[KernelNode]) -> list[Segment | KernelNode]:
    """Group consecutive ``"xr"`` nodes into loops, breaking on reads of pending results."""
    parts: list[Segment | KernelNode] = []
    open_segment: Segment | None = None
    pending: set[str] = set()
    for node in nodes:
        if node.mode != "xr":
            parts.append(node)
            open_segment, pending = None, set()
            continue
        if open_segment is None or reads_of(node) & pending:
            open_segment, pending = Segment([]), set()
            parts.append(open_segment)
        open_segment.nodes.append(node)
        if node.kind == "reduction":
            pending.add(node.name)
    return parts
