"""Attention written out as ``softmax(q @ k^T * scale [+ mask]) @ v`` becomes one fused call.

A torch-level rewrite of the captured graph, run before autograd_aot (so training gets the
fused kernel's own backward). Unfused, the (L, S) score matrix is written and read three
times per head and the two matmuls cannot share it; ``scaled_dot_product_attention`` keeps
it on chip (FlashAttention on CUDA, a blocked kernel on CPU). The pattern matches only
where nothing else reads the scores, the softmax runs over the last dim in the inputs'
dtype, and ``q``, ``k``, ``v`` are 4-D with the same batch and head dims: the shapes every
fused kernel accepts. A dropout that keeps every value may sit between the softmax and the
second matmul, and Swin's shifted windows add their mask through a 5-D view of the scores
(``(s.view(B, nW, H, L, S) + m).view(B * nW, H, L, S)``): that mask and the others are then
added up front into one (B * nW, H, L, S) mask.
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
_DROPOUTS = {F.dropout, torch.dropout}
_ADDS = {operator.add, torch.add, "add"}
_VIEWS = {"view", "reshape", torch.reshape}
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


def _operands(node: fx.Node, targets: set[Any]) -> tuple[fx.Node, fx.Node] | None:
    """The two operands of ``a @ b`` or ``a + b`` (``node`` calls one of ``targets``), both
    nodes; else None."""
    if _target(node) not in targets or len(node.args) != 2 or node.kwargs:
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


def _identity_dropout(node: fx.Node) -> fx.Node | None:
    """The input of a dropout that keeps every value (``p == 0`` or not training), else None."""
    if _target(node) not in _DROPOUTS:
        return None
    args, kwargs = list(node.args), dict(node.kwargs)
    names = ("input", "p", "train" if node.target is torch.dropout else "training", "inplace")
    given = dict(zip(names, args, strict=False)) | kwargs
    src, p = given.get("input"), given.get("p", 0.5)
    if not isinstance(src, fx.Node) or given.get("inplace", False):
        return None
    keeps = (isinstance(p, (int, float)) and p == 0) or given.get(names[2], True) is False
    return src if keeps else None


def _viewed(node: fx.Node) -> fx.Node | None:
    """The source of ``x.view(...)`` or ``x.reshape(...)``, else None."""
    if _target(node) not in _VIEWS or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    return node.args[0]


def _windowed(scores: fx.Node) -> dict[str, Any] | None:
    """``(s.view(B, nW, H, L, S) + m).view(B * nW, H, L, S)`` (Swin's shifted windows):
    ``s``, ``m``, both shapes and the nodes in between (the outermost first), else None."""
    added = _viewed(scores)
    pair = _operands(added, _ADDS) if added is not None else None
    inner = _viewed(pair[0]) if pair is not None else None
    if added is None or pair is None or inner is None:
        return None
    outer_v, five_v, inner_v, mask_v = _val(scores), _val(pair[0]), _val(inner), _val(pair[1])
    if outer_v is None or five_v is None or inner_v is None or mask_v is None:
        return None
    shape, five = tuple(outer_v.shape), tuple(five_v.shape)
    if tuple(inner_v.shape) != shape or len(shape) != 4 or len(five) != 5:
        return None
    if five[0] * five[1] != shape[0] or five[2:] != shape[1:] or mask_v.dtype != outer_v.dtype:
        return None
    try:
        if torch.broadcast_shapes(mask_v.shape, five) != five:
            return None
    except RuntimeError:
        return None
    return {"scores": inner, "mask": pair[1], "shape": shape, "five": five,
            "chain": [scores, added, pair[0]]}  # fmt: skip


def _match(softmax: fx.Node) -> dict[str, Any] | None:
    """The pieces of the attention whose softmax is ``softmax``, or None.

    Walks back from the softmax through Swin's windowed mask, an optional ``+ mask`` and
    an optional scale to ``q @ k^T``, and forward through a dropout that keeps every value
    to ``@ v``; every node on the way has the next one as its only reader, so all of them
    go once the fused call replaces ``softmax @ v``.
    """
    scores = _softmax_input(softmax)
    out = _only_user(softmax)
    kept = _identity_dropout(out) if out is not None else None
    dropout = out if kept is softmax else None
    if dropout is not None:
        out = _only_user(dropout)
    operands = _operands(out, _MATMULS) if out is not None else None
    probs = dropout if dropout is not None else softmax
    if scores is None or out is None or operands is None or operands[0] is not probs:
        return None
    chain = [softmax]
    windowed = _windowed(scores)
    if windowed is not None:
        chain += windowed["chain"]
        scores = windowed["scores"]
    mask = None
    if _target(scores) in _ADDS:
        pair = _operands(scores, _ADDS)
        if pair is None:
            return None
        chain.append(scores)
        scores, mask = pair
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
    qk = _operands(scores, _MATMULS)
    if qk is None:
        return None
    q, kt = qk
    prescaled = _scaled(q) if _only_user(q) is scores else None
    if prescaled is not None:  # (q * s) @ k^T, as timm scales: one pass over q less
        chain.append(q)
        q, first = prescaled
        scale *= first
    dead = [out, *([dropout] if dropout is not None else []), *chain]
    return {"q": q, "kt": kt, "v": operands[1], "mask": mask, "scale": scale, "out": out,
            "windowed": windowed, "dead": dead}  # fmt: skip


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


_MASK_ROW_ALIGN = 8
"""Elements a mask row of the memory-efficient CUDA kernel is padded to: ATen copies a mask
whose strides are not multiples of it into a padded one on every call."""


def _window_mask(graph: fx.Graph, mask: fx.Node | None, windowed: dict[str, Any]) -> fx.Node:
    """The windowed attention's masks added into one of the scores' shape (B * nW, H, L, S):
    the window mask repeats over the batch, which no broadcast of a 4-D mask expresses. Its
    rows are written padded (Swin's 49 keys to 56), so ATen takes the mask as it is."""
    shape, five = windowed["shape"], windowed["five"]
    if mask is None:
        total = graph.call_method("expand", (windowed["mask"], *five))
    else:
        spread = graph.call_method("expand", (mask, *shape))
        parts = graph.call_method("reshape", (spread, *five))
        total = graph.call_function(operator.add, (parts, windowed["mask"]))
    flat = graph.call_method("reshape", (total, *shape))
    pad = -shape[-1] % _MASK_ROW_ALIGN
    if not pad:
        return flat
    padded = graph.call_function(F.pad, (flat, (0, pad)))
    return graph.call_method("narrow", (padded, -1, 0, shape[-1]))


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
            mask = found["mask"]
            if found["windowed"] is not None:
                mask = _window_mask(graph, mask, found["windowed"])
            kwargs = {"attn_mask": mask, "scale": found["scale"]}
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
