"""Large matrix products with an unaligned output width compute a padded width, then narrow.

A torch-level rewrite of the captured graph, run before autograd_aot (so the backward's
GEMMs are padded too). cuBLAS picks its fast tensor-core kernels only when every matrix's
columns come in whole 16-byte units; otherwise it runs a 2-byte aligned kernel several times
slower (a language model's bfloat16 logits over a vocabulary of odd size). Padding the row
pitch of the result alone does not change cuBLAS's choice; computing the next multiple of the
alignment's columns from a zero-padded copy of the weight does, as Inductor's matmul padding
does, and the copy of the weight costs far less than the kernel saves. The result is
the first ``N`` columns of the padded product: a view, so a graph output keeps the padded rows.

Only the weight side is padded: the products this targets have a weight much smaller than
their output. A backend asks for it with ``matmul_align_bytes`` (see :mod:`kiln.loopir.traits`).
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from kiln.loopir.backend import Backend, get_backend

__all__ = ["pad_matmuls"]

log = logging.getLogger("kiln.loopir")

_LINEARS = {F.linear, torch._C._nn.linear}
_MATMULS = {operator.matmul, torch.matmul, torch.mm, "matmul", "mm"}
_HALF = {torch.float16, torch.bfloat16}

# Products with fewer rows than MIN_ROWS, or smaller outputs than MIN_OUTPUT elements, are
# left alone: the padded copy of the weight would cost about what the faster kernel saves.
MIN_ROWS = 512
MIN_OUTPUT = 1 << 22


def _val(arg: Any) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _align(value: torch.Tensor, backend: Backend | None) -> int:
    """Columns per aligned unit for ``value``'s dtype on its backend (1: never pad)."""
    found = backend if backend is not None else get_backend(value.device.type)
    align_bytes = found.traits.matmul_align_bytes
    tensor_cores = value.dtype in _HALF or (
        value.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    )
    if not tensor_cores or align_bytes <= value.element_size():
        return 1
    return align_bytes // value.element_size()


def _operands(node: fx.Node) -> tuple[Any, fx.Node, Any, bool] | None:
    """(input, weight, bias, transposed) of a linear or a matmul by a 2-D matrix, else None.

    ``transposed``: the weight is ``(N, K)`` (a linear's) rather than ``(K, N)``.
    """
    if node.op not in ("call_function", "call_method"):
        return None
    args = list(node.args)
    kwargs = dict(node.kwargs)
    if node.target in _LINEARS:
        x = args.pop(0) if args else kwargs.pop("input", None)
        w = args.pop(0) if args else kwargs.pop("weight", None)
        bias = args.pop(0) if args else kwargs.pop("bias", None)
        transposed = True
    elif node.target in _MATMULS and len(args) == 2 and not kwargs:
        (x, w), args = args, []
        bias, transposed = None, False
    else:
        return None
    if args or kwargs or not isinstance(w, fx.Node):
        return None
    wv = _val(w)
    if wv is None or wv.dim() != 2 or (bias is not None and not isinstance(bias, fx.Node)):
        return None
    return x, w, bias, transposed


def _padding(node: fx.Node, backend: Backend | None) -> int:
    """How many columns to add to ``node``'s product (0: leave it alone)."""
    out = _val(node)
    if out is None or out.dim() < 2 or not out.is_floating_point():
        return 0
    cols, numel = out.shape[-1], out.numel()
    if not isinstance(cols, int) or not isinstance(numel, int) or cols == 0:
        return 0
    if numel // cols < MIN_ROWS or numel < MIN_OUTPUT:
        return 0
    align = _align(out, backend)
    return -cols % align


def pad_matmuls(gm: fx.GraphModule, backend: Backend | None = None) -> int:
    """Pad each large unaligned product of ``gm`` in place; return how many were padded.

    ``backend``'s traits give ``matmul_align_bytes``; by default the backend of each product's device.
    """
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        found = _operands(node)
        if found is None:
            continue
        pad = _padding(node, backend)
        if pad == 0:
            continue
        x, w, bias, transposed = found
        cols = node.meta["val"].shape[-1]
        with graph.inserting_before(node):
            # zeros after the last output feature: rows of a (N, K) weight, columns of (K, N)
            padded_w = graph.call_function(F.pad, (w, (0, 0, 0, pad) if transposed else (0, pad)))
            padded_b = graph.call_function(F.pad, (bias, (0, pad))) if bias is not None else None
            args = (x, padded_w, padded_b) if transposed else (x, padded_w)
            product = graph.create_node(node.op, node.target, args)
            narrowed = graph.call_function(torch.narrow, (product, -1, 0, cols))
        # the source location (for error messages), not the value: the new ones differ
        where = {k: v for k, v in node.meta.items() if k != "val"}
        for new in (padded_w, padded_b, product, narrowed):
            if new is not None:
                new.meta.update(where)
        node.replace_all_uses_with(narrowed)
        graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
        log.debug("matmul padding: %d products computed on aligned widths", count)
    return count
