"""Which layout a graph's new 4-D buffers take: NCHW, or NHWC (channels-last).

A whole-graph choice made once before lowering, from the graph's convolutions and matrix
products and the layouts its outputs must come back in; :class:`~kiln.loopir.graph.GraphLowering`
lays its new 4-D buffers out by it.
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from kiln.loopir.lowering.fallback import is_convolution, is_packed_convolution, packet_name

__all__ = ["prefers_channels_last"]


def prefers_channels_last(gm: torch.fx.GraphModule, device: torch.device) -> bool:
    """Whether the graph's 4-D buffers should be NHWC (Inductor's layout optimisation).

    cuDNN runs convolutions in NHWC: fed NCHW it transposes every input and output,
    a sizeable part of a convolution net's step. So on CUDA a graph with 2-D convolutions
    lays its new 4-D buffers out channels-last, unless a 4-D graph output must come
    back NCHW (a training forward's saved activations), which would cost a copy each.
    On CPU, oneDNN's NHWC grouped (depthwise) convolutions are much faster than its
    NCHW ones, but its dense ones are not, and NHWC slows the permutes around matrix
    products: a CPU graph goes channels-last only if it has a grouped convolution and
    at least as many convolutions as matrix products (depthwise nets gain from NHWC; nets
    of dense convolutions, or of linear layers between convolutions, lose). A convolution
    freezing runs on a prepacked oneDNN weight counts as grouped: it answers NHWC and copies
    an NCHW input to NHWC itself.
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
    return not any(
        isinstance(t, torch.Tensor)
        and t.dim() == 4
        and not t.is_contiguous(memory_format=torch.channels_last)
        for t in returned
    )


_MATRIX_PRODUCTS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"})


def _cpu_prefers_nhwc(nodes: list[torch.fx.Node], convs: list[torch.fx.Node]) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    grouped = any(
        is_packed_convolution(n.target) or (len(n.args) > 8 and n.args[8] != 1) for n in convs
    )
    products = [n for n in nodes if packet_name(n.target) in _MATRIX_PRODUCTS]
    return grouped and len(convs) >= len(products)


def _dim(node: torch.fx.Node) -> int:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else -1
