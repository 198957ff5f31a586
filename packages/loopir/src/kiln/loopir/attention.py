"""Attention written out as ``softmax(q @ k^T * scale [+ mask]) @ v`` becomes one fused call.

A torch-level rewrite of the captured graph, run before autograd_aot (so training gets the
fused kernel's own backward). Unfused, the (L, S) score matrix is written and read three
times per head and the two matmuls cannot share it; ``scaled_dot_product_attention`` keeps
it on chip (FlashAttention on CUDA, a blocked kernel on CPU). The pattern matches only
where nothing else reads the scores, the softmax runs over the last dim in the inputs'
dtype, and ``q``, ``k``, ``v`` are 4-D with the same batch and head dims: the shapes every
fused kernel accepts.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

__all__ = ["fuse_attention"]

log = logging.getLogger("kiln.loopir")

_MATMULS = {operator.matmul, torch.matmul, "matmul"}
_SOFTMAXES = {torch.softmax, F.softmax, torch.Tensor.softmax, "softmax"}
_FLOATS = {torch.float32, torch.float16, torch.bfloat16}


def _target(node: fx.Node) -> Any:
    """The op, with ``x.f(...)`` and ``torch.f(x, ...)`` alike."""
    if node.op in ("call_function", "call_method"):
        return node.target
    return None


def _val(arg: Any) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _matmul_operands(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    if _target(node) not in _MATMULS or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    return (a, b) if isinstance(a, fx.Node) and isinstance(b, fx.Node) else None


def _softmax_input(node: fx.Node) -> fx.Node | None:
    """The input of a softmax over the last dim that keeps its input's dtype, else None."""
    if _target(node) not in _SOFTMAXES:
        return None
    kwargs = dict(node.kwargs)
    args = list(node.args)
    src = args.pop(0) if args else kwargs.pop("input", None)
    dim = args.pop(0) if args else kwargs.pop("dim", None)
    dtype = args.pop(0) if args else kwargs.pop("dtype", None)
    value = _val(src)
    if args or set(kwargs) - {"_stacklevel"} or value is None or not isinstance(dim, int):
        return None
    if dim not in (-1, value.dim() - 1) or dtype not in (None, value.dtype):
        return None
    return src if isinstance(src, fx.Node) else None


def _scaled(node: fx.Node) -> tuple[fx.Node, float] | None:
    """``x * s`` or ``x / s`` with a Python number ``s``: (x, the scale); else None."""
    target = _target(node)
    if len(node.args) == 2 and not node.kwargs:
        x, s = node.args
        if isinstance(x, fx.Node) and isinstance(s, (int, float)) and not isinstance(s, bool):
            if target in (operator.mul, torch.mul, "mul") and s != 0:
                return x, float(s)
            if target in (operator.truediv, torch.div, "div") and s != 0:
                return x, 1.0 / float(s)
    return None


def _match(softmax: fx.Node) -> dict[str, Any] | None:
    """The pieces of the attention whose softmax is ``softmax``, or None.

    Walks back from the softmax through an optional ``+ mask`` and an optional scale to
    ``q @ k^T``; every node on the way has the next one as its only reader, so all of them
    go once the fused call replaces ``softmax @ v``.
    """
    scores = _softmax_input(softmax)
    out = _only_user(softmax)
    operands = _matmul_operands(out) if out is not None else None
    if scores is None or out is None or operands is None or operands[0] is not softmax:
        return None
    chain = [softmax]
    mask = None
    if _target(scores) in (operator.add, torch.add, "add") and len(scores.args) == 2:
        left, right = scores.args
        if scores.kwargs or not isinstance(left, fx.Node) or not isinstance(right, fx.Node):
            return None
        chain.append(scores)
        scores, mask = left, right
    scale = 1.0  # softmax(q @ k^T) unscaled; SDPA's own default would be 1/sqrt(E)
    found = _scaled(scores)
    if found is not None:
        chain.append(scores)
        scores, scale = found
    chain.append(scores)
    if any(
        _only_user(node) is not after for node, after in zip(chain[1:], chain[:-1], strict=True)
    ):
        return None
    qk = _matmul_operands(scores)
    if qk is None:
        return None
    q, kt = qk
    return {
        "q": q,
        "kt": kt,
        "v": operands[1],
        "mask": mask,
        "scale": scale,
        "out": out,
        "dead": [out, *chain],
    }


def _fits(q: Any, kt: Any, v: Any, mask: Any) -> bool:
    """Shapes and dtypes every fused attention kernel takes."""
    tensors = [_val(q), _val(kt), _val(v)]
    if any(t is None for t in tensors):
        return False
    qv, ktv, vv = tensors
    assert qv is not None and ktv is not None and vv is not None
    if qv.dim() != 4 or ktv.dim() != 4 or vv.dim() != 4 or qv.dtype not in _FLOATS:
        return False
    if ktv.dtype != qv.dtype or vv.dtype != qv.dtype or len({qv.device, ktv.device, vv.device}) > 1:
        return False
    lead = qv.shape[:2]
    if ktv.shape[:2] != lead or vv.shape[:2] != lead:
        return False
    if qv.shape[3] != ktv.shape[2] or ktv.shape[3] != vv.shape[2]:
        return False
    if mask is None:
        return True
    mv = _val(mask)
    scores = (*lead, qv.shape[2], ktv.shape[3])
    try:
        shape_ok = torch.broadcast_shapes(mv.shape, scores) == scores if mv is not None else False
    except RuntimeError:
        return False
    return shape_ok and mv is not None and mv.dtype == qv.dtype and mv.device == qv.device


def fuse_attention(gm: fx.GraphModule) -> int:
    """Rewrite each written-out attention in ``gm`` in place; return how many were rewritten."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        found = _match(node)
        if found is None or not _fits(found["q"], found["kt"], found["v"], found["mask"]):
            continue
        out = found["out"]
        with graph.inserting_before(out):
            k = graph.call_function(torch.transpose, (found["kt"], -2, -1))
            kwargs = {"attn_mask": found["mask"], "scale": found["scale"]}
            fused = graph.call_function(
                F.scaled_dot_product_attention, (found["q"], k, found["v"]), kwargs
            )
        out.replace_all_uses_with(fused)
        for dead in found["dead"]:
            graph.erase_node(dead)
        count += 1
    if count:
        gm.recompile()
        log.debug(
            "attention: %d softmax(q @ k^T) @ v rewritten to scaled_dot_product_attention", count
        )
    return count
