"""Which layout a graph's new 4-D buffers take: NCHW, or NHWC (channels-last).

A whole-graph choice made once before lowering, from the graph's convolutions and matrix
products and the layouts its outputs must come back in; :class:`~kiln.loopir.graph.GraphLowering`
lays its new 4-D buffers out by it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils import _pytree as pytree

from kiln.loopir import sizes, symbolic
from kiln.loopir.errors import StaticShapesOnly
from kiln.loopir.lowering.fallback import is_convolution, is_packed_convolution, packet_name

__all__ = ["prefers_channels_last"]


def prefers_channels_last(gm: torch.fx.GraphModule, device: torch.device) -> bool:
    """Whether the graph's 4-D buffers should be NHWC (Inductor's layout optimisation).

    cuDNN runs convolutions in NHWC: fed NCHW it transposes every input and output,
    a sizeable part of a convolution net's step. So on CUDA a graph with 2-D convolutions
    lays its new 4-D buffers out channels-last, unless the 4-D graph outputs that must come
    back NCHW, copied once each, hold at least as many bytes as those transposes would move:
    a network returning its last feature map (an encoder's ``last_hidden_state``) copies that
    one map, where a training forward, whose saved activations are most of its buffers, would
    copy more than NHWC saves. A graph input a convolution reads is transposed either way.
    On CPU, oneDNN's NHWC grouped (depthwise) convolutions are much faster than its
    NCHW ones, but its dense ones are not, and NHWC slows the permutes around matrix
    products: a graph of plain ATen convolutions goes channels-last only if it has a grouped
    convolution and at least as many convolutions as matrix products. A convolution freezing
    runs on a prepacked oneDNN weight answers NHWC whatever its input's layout, and copies an
    NCHW input to NHWC itself: an NCHW graph pays two copies around each, more than NHWC
    costs the matrix products of convolution and attention hybrids, ConvNeXt or MetaFormers,
    so a graph with one goes channels-last.
    """
    if device.type not in ("cuda", "cpu"):
        return False
    nodes = list(gm.graph.nodes)
    convs = [
        n
        for n in nodes
        if (is_convolution(n.target) or is_packed_convolution(n.target)) and _dim(n) == 4
    ]
    if not convs:
        return False
    if device.type == "cpu" and not _cpu_prefers_nhwc(nodes, convs):
        return False
    outputs = [n for n in nodes if n.op == "output"]
    returned = pytree.tree_leaves(
        torch.fx.map_arg(outputs[0].args[0], lambda n: n.meta.get("val")) if outputs else []
    )
    copied = [
        t
        for t in returned
        if isinstance(t, torch.Tensor)
        and t.dim() == 4
        and not t.is_contiguous(memory_format=torch.channels_last)
    ]
    if not copied:
        return True
    transposed = [n.meta.get("val") for n in convs]
    transposed += [
        n.args[0].meta.get("val")
        for n in convs
        if isinstance(n.args[0], torch.fx.Node) and n.args[0].op != "placeholder"
    ]
    cost, saved = _bytes(copied), _bytes(transposed)
    return cost is not None and saved is not None and cost < saved


_MATRIX_PRODUCTS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"})


def _cpu_prefers_nhwc(nodes: list[torch.fx.Node], convs: list[torch.fx.Node]) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if any(is_packed_convolution(n.target) for n in convs):
        return True
    grouped = any(len(n.args) > 8 and n.args[8] != 1 for n in convs)
    products = [n for n in nodes if packet_name(n.target) in _MATRIX_PRODUCTS]
    return grouped and len(convs) >= len(products)


def _bytes(values: Sequence[object]) -> int | None:
    """Bytes the tensors among ``values`` hold (sizes at their hints); None where unknown."""
    total = 0
    for t in values:
        if not isinstance(t, torch.Tensor):
            continue
        try:
            total += symbolic.hint(sizes.sympify(t.numel())) * t.element_size()
        except StaticShapesOnly:
            return None
    return total


def _dim(node: torch.fx.Node) -> int:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else -1
