"""Attention masks that are constants of the graph: dropped, or made ``is_causal``.

Libraries build attention masks from positions even where nothing is masked: HuggingFace,
while a compiler captures, makes an all-true (B, 1, L, S) mask instead of looking at the
padding mask's values (which eager does, and then passes no mask). A mask computed from
factories alone (``arange``, ``ones``, ... with constant arguments; no graph input reaches
it) is the same on every call, so it is evaluated once, here: an all-true boolean or
all-zero additive mask is dropped, and the lower-triangular boolean one becomes
``is_causal=True``. Without a mask tensor, scaled dot product attention runs FlashAttention
(or cuDNN's) instead of a kernel that reads a (B, H, L, S) bias, and the mask is never built.
A torch-level rewrite of the captured graph, run before autograd_aot like ``fuse_attention``.

A mask that stays, on a CUDA device, is made contiguous when its last dimension is not
(a (B, 1, 1, S) padding mask ``expand``-ed to (B, 1, L, S) has stride 0 there): CUDA's fused
attention kernels refuse such a mask and the op falls back to its math path (two batched
matmuls and a softmax over a materialized score tensor), where a contiguous copy of a mask of
B * L * S elements lets the memory-efficient kernel run. This is the usual case with symbolic
sizes, where the padding mask cannot be evaluated once and dropped.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx
from torch.utils import _pytree as pytree

from kiln.capture.meta import fake_like
from kiln.capture.shapes import has_symbolic_sizes
from kiln.loopir.symbolic_masks import symbolic_mask_verdict

__all__ = ["contiguous_attention_masks", "simplify_attention_masks"]

log = logging.getLogger("kiln.loopir")

_FACTORIES = {torch.arange, torch.ones, torch.zeros, torch.full, torch.eye, torch.linspace}
# ops whose results differ between calls (or are uninitialised) never make a constant
_UNSTABLE = ("rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "empty")
_OPERATOR_IN_PLACE = {
    operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
    operator.imod, operator.imul, operator.ior, operator.ipow, operator.irshift, operator.isub,
    operator.itruediv, operator.ixor,
}  # fmt: skip
_MAX_NODES = 64  # a mask is a handful of ops; larger subgraphs are not worth evaluating
# results held while evaluating: masks of long sequences (L * S bytes each) stay in the graph
_MAX_BYTES = 256 << 20


class _NotConstant(Exception):
    pass


def _in_place(target: Any, name: str) -> bool:
    """``x.add_(y)``, ``torch.relu_(x)``, ``x += y``: evaluated out of graph order, a write
    would reach other uses of ``x`` (``operator.and_`` is plain ``&``)."""
    if getattr(target, "__module__", None) in ("_operator", "operator"):
        return target in _OPERATOR_IN_PLACE
    return name.endswith("_") and not name.startswith("__")


def _nbytes(value: Any) -> int:
    """Bytes of storage a (real or fake) tensor holds; an expanded view holds its base's."""
    if not isinstance(value, torch.Tensor):
        return 0
    try:
        return int(value.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return value.numel() * value.element_size()


class _Evaluator:
    """Values of nodes computed from factories and constants alone (``_NotConstant`` for
    any other), within ``_MAX_NODES`` nodes and ``_MAX_BYTES`` of results."""

    def __init__(self) -> None:
        self.memo: dict[fx.Node, Any] = {}
        self.nbytes = 0

    def __call__(self, node: fx.Node) -> Any:
        if node in self.memo:
            return self.memo[node]
        if len(self.memo) >= _MAX_NODES or node.op not in ("call_function", "call_method"):
            raise _NotConstant
        target = node.target
        name = target if isinstance(target, str) else getattr(target, "__name__", "")
        if any(word in name.lower() for word in _UNSTABLE) or _in_place(target, name):
            raise _NotConstant
        leaves = pytree.tree_leaves((node.args, node.kwargs))
        inputs = [a for a in leaves if isinstance(a, fx.Node)]
        if not inputs and target not in _FACTORIES:
            raise _NotConstant
        traced = node.meta.get("val")
        if isinstance(traced, torch.Tensor) and has_symbolic_sizes(traced):
            # its value changes with the sizes (and reading its size would guard on them)
            raise _NotConstant
        # the traced value says how large the result is before it is computed
        if self.nbytes + _nbytes(traced) > _MAX_BYTES:
            raise _NotConstant
        values = {a: self(a) for a in inputs}
        args, kwargs = pytree.tree_map(
            lambda a: values[a] if isinstance(a, fx.Node) else a, (node.args, node.kwargs)
        )
        if isinstance(target, str):  # call_method
            result = getattr(args[0], target)(*args[1:], **kwargs)
        else:
            result = target(*args, **kwargs)
        self.memo[node] = result
        self.nbytes += _nbytes(result)
        if self.nbytes > _MAX_BYTES:
            raise _NotConstant
        return result


def _constant(node: Any) -> tuple[torch.Tensor, list[fx.Node]] | None:
    """The value of ``node`` if it is a constant tensor, with the nodes that computed it."""
    if not isinstance(node, fx.Node):
        return None
    evaluate = _Evaluator()
    try:
        value = evaluate(node)
    except _NotConstant:
        return None
    except Exception as exc:  # an op that fails outside the graph: leave the mask as it is
        log.debug("attention mask %s not evaluated: %s", node.name, exc)
        return None
    return (value, list(evaluate.memo)) if isinstance(value, torch.Tensor) else None


def _causal(mask: torch.Tensor) -> bool:
    """Whether ``mask`` is SDPA's ``is_causal`` mask (square, lower-triangular) broadcast."""
    if mask.dim() < 2 or mask.shape[-1] != mask.shape[-2]:
        return False
    size = mask.shape[-1]
    tril = torch.ones(size, size, dtype=torch.bool, device=mask.device).tril()
    return bool(torch.equal(mask, tril.expand_as(mask)))


def _verdict(mask: Any) -> tuple[str, list[fx.Node]] | None:
    """``("pass" or "causal", the nodes computing it)`` for a mask that is a constant of the
    graph, evaluated here or, over symbolic sizes, as a rule of positions; else None."""
    found = _constant(mask)
    if found is None:
        return symbolic_mask_verdict(mask)
    value, computed = found
    passes_all = bool(value.all()) if value.dtype == torch.bool else not bool(value.any())
    if passes_all and (value.dtype == torch.bool or value.is_floating_point()):
        return "pass", computed
    if value.dtype == torch.bool and _causal(value):
        return "causal", computed
    return None


def simplify_attention_masks(gm: fx.GraphModule) -> int:
    """Drop constant all-pass masks of ``scaled_dot_product_attention`` calls in ``gm`` and
    make constant causal ones ``is_causal``; return how many calls changed."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.target is not F.scaled_dot_product_attention or len(node.args) > 3:
            continue
        if node.kwargs.get("is_causal"):
            continue
        verdict = _verdict(node.kwargs.get("attn_mask"))
        if verdict is None:
            continue
        kind, computed = verdict
        kwargs = dict(node.kwargs)
        kwargs["attn_mask"] = None
        if kind == "causal":
            kwargs["is_causal"] = True
        node.kwargs = kwargs
        for dead in reversed(computed):  # memo order: every node after its inputs
            if not dead.users:
                gm.graph.erase_node(dead)
        count += 1
    if count:
        gm.recompile()
        log.debug("attention: %d constant masks dropped or made is_causal", count)
    return count


def contiguous_attention_masks(gm: fx.GraphModule) -> int:
    """Give ``scaled_dot_product_attention`` calls in ``gm`` on CUDA a contiguous copy of a mask
    whose last dimension is not contiguous (see the module docstring); return how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.target is not F.scaled_dot_product_attention:
            continue
        mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        traced = mask.meta.get("val") if isinstance(mask, fx.Node) else None
        if not isinstance(traced, torch.Tensor) or traced.device.type != "cuda":
            continue
        if traced.dim() == 0 or traced.stride(-1) == 1:
            continue
        with gm.graph.inserting_before(node):
            dense = gm.graph.call_method("contiguous", (mask,))
        # a fake built from a meta tensor: no op runs on the CUDA fake (no driver needed)
        meta = torch.empty(traced.shape, dtype=traced.dtype, device="meta")
        dense.meta["val"] = fake_like(meta, traced.device)
        if "attn_mask" in node.kwargs:
            node.kwargs = {**node.kwargs, "attn_mask": dense}
        else:
            node.args = (*node.args[:3], dense, *node.args[4:])
        count += 1
    if count:
        gm.recompile()
        log.debug("attention: %d masks made contiguous for the fused CUDA kernels", count)
    return count
