"""The attention rewrite: which written-out attentions become scaled_dot_product_attention."""

import math

import pytest
import torch
import torch.nn.functional as F
from loopir_testing import aten_graph
from torch import fx

from kiln.loopir import fuse_attention


def _sdpa_calls(gm: fx.GraphModule) -> int:
    return sum(n.target is F.scaled_dot_product_attention for n in gm.graph.nodes)


def _qkv(b: int = 2, h: int = 3, t: int = 8, s: int = 8, e: int = 16) -> list[torch.Tensor]:
    return [torch.randn(b, h, t, e), torch.randn(b, h, s, e), torch.randn(b, h, s, e)]


def _div(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(16), dim=-1) @ v


def _mul(q, k, v):
    return (q @ k.transpose(-1, -2) * 0.3).softmax(-1).matmul(v)


def _unscaled(q, k, v):
    return torch.matmul(F.softmax(torch.matmul(q, k.mT), dim=3), v)


def _masked(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + mask, dim=-1) @ v


@pytest.mark.parametrize("fn", [_div, _mul, _unscaled], ids=["div", "mul", "unscaled"])
def test_written_out_attention_is_one_fused_call(fn):
    args = _qkv(s=12)
    gm = aten_graph(fn, *args)
    assert fuse_attention(gm) == 1
    assert _sdpa_calls(gm) == 1
    assert not any(n.target in (torch.softmax, F.softmax, "softmax") for n in gm.graph.nodes)
    torch.testing.assert_close(gm(*args), fn(*args))


def test_additive_mask_becomes_attn_mask():
    args = [*_qkv(), torch.randn(1, 1, 8, 8)]
    gm = aten_graph(_masked, *args)
    assert fuse_attention(gm) == 1
    fused = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    assert fused.kwargs["attn_mask"] is not None and fused.kwargs["scale"] == 0.25
    torch.testing.assert_close(gm(*args), _masked(*args))


def test_gradients_match():
    args = [t.requires_grad_() for t in _qkv()]
    gm = aten_graph(_div, *args)
    assert fuse_attention(gm) == 1
    grads = torch.autograd.grad(gm(*args).sum(), args)
    want = torch.autograd.grad(_div(*args).sum(), args)
    torch.testing.assert_close(grads, want)


def _probs_returned(q, k, v):
    probs = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return probs @ v, probs


def _first_dim(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1), dim=2) @ v


def _float_softmax(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1, dtype=torch.float64).to(q.dtype) @ v


def _three_d(q, k, v):
    return torch.softmax(q[0] @ k[0].transpose(-2, -1), dim=-1) @ v[0]


def _scores_reused(q, k, v):
    scores = q @ k.transpose(-2, -1)
    return torch.softmax(scores * 0.5, dim=-1) @ v + scores.sum()


@pytest.mark.parametrize(
    "fn",
    [_probs_returned, _first_dim, _float_softmax, _three_d, _scores_reused],
    ids=["probs-returned", "softmax-dim-2", "softmax-dtype", "3-d", "scores-reused"],
)
def test_other_shapes_are_left_alone(fn):
    args = _qkv()
    gm = aten_graph(fn, *args)
    assert fuse_attention(gm) == 0
    assert _sdpa_calls(gm) == 0
