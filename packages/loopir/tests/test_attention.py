"""The attention rewrite: which written-out attentions become scaled_dot_product_attention."""

import math
import operator

import pytest
import torch
import torch.nn.functional as F
from loopir_testing import aten_graph
from torch import fx
from torch.utils import _pytree as pytree

from kiln.capture.meta import FakeTensor, meta_of, to_fake
from kiln.loopir import attention_masks, fuse_attention, simplify_attention_masks
from kiln.loopir.attention_masks import contiguous_attention_masks


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


def _masked_attention_graph(make_mask, calls: int = 1) -> fx.GraphModule:
    """``scaled_dot_product_attention(q, k, v, attn_mask=make_mask(g, q))`` ``calls``
    times on one mask, built by hand: tracing would fold a mask of constants away."""
    g = fx.Graph()
    q, k, v = (g.placeholder(name) for name in "qkv")
    mask = make_mask(g, q)
    outs = [
        g.call_function(F.scaled_dot_product_attention, (q, k, v), {"attn_mask": mask})
        for _ in range(calls)
    ]
    g.output(tuple(outs))
    return fx.GraphModule(torch.nn.Module(), g)


def _positions(g: fx.Graph, *where: tuple) -> list[fx.Node]:
    i = g.call_function(torch.arange, (8,))
    return [g.call_function(operator.getitem, (i, index)) for index in where]


_ROWS = (None, None, slice(None), None)
_COLS = (None, None, None, slice(None))


def _all_true(g, q):
    (rows,) = _positions(g, _ROWS)
    return g.call_method("expand", (g.call_function(operator.ge, (rows, 0)), 2, 1, 8, 8))


def _causal(g, q):
    rows, cols = _positions(g, _ROWS, _COLS)
    return g.call_function(operator.le, (cols, rows))


def _causal_and_all_true(g, q):  # HuggingFace's causal mask and its packed-sequence check
    rows, cols = _positions(g, _ROWS, _COLS)
    same = g.call_function(operator.ge, (cols, -1))
    return g.call_function(operator.and_, (g.call_function(operator.le, (cols, rows)), same))


def _in_place(g, q):  # written in place: evaluated out of graph order it could differ
    rows, cols = _positions(g, _ROWS, _COLS)
    return g.call_function(operator.iand, (g.call_function(operator.le, (cols, rows)), True))


def _zeros(g, q):
    return g.call_function(torch.zeros, (1, 1, 8, 8))


def _padding(g, q):  # the last three keys masked: a real mask, kept
    (cols,) = _positions(g, _COLS)
    return g.call_function(operator.lt, (cols, 5))


def _from_input(g, q):  # depends on a graph input: not a constant
    return g.call_function(operator.gt, (q, 0.0))


def _random(g, q):
    return g.call_function(operator.gt, (g.call_function(torch.rand, (8, 8)), -1.0))


@pytest.mark.parametrize(
    ("make_mask", "kwargs"),
    [(_all_true, {"attn_mask": None}), (_causal, {"attn_mask": None, "is_causal": True}),
     (_causal_and_all_true, {"attn_mask": None, "is_causal": True}),
     (_zeros, {"attn_mask": None})],
    ids=["all-true", "causal", "causal-and", "zeros"],
)  # fmt: skip
def test_constant_masks_are_dropped_or_made_causal(make_mask, kwargs):
    args = _qkv()
    gm = _masked_attention_graph(make_mask, calls=2)
    expected = gm(*args)
    assert simplify_attention_masks(gm) == 2
    calls = [n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention]
    assert all(n.kwargs == kwargs for n in calls)
    # the mask's nodes go with its last use
    assert [n.op for n in gm.graph.nodes] == ["placeholder"] * 3 + ["call_function"] * 2 + [
        "output"
    ]
    torch.testing.assert_close(gm(*args), expected)


@pytest.mark.parametrize("make_mask", [_padding, _from_input, _random, _in_place])
def test_masks_that_mask_or_vary_are_kept(make_mask):
    gm = _masked_attention_graph(make_mask)
    assert simplify_attention_masks(gm) == 0
    call = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    assert call.kwargs["attn_mask"] is not None


def test_masks_too_large_to_evaluate_are_kept(monkeypatch):
    """Evaluating holds every intermediate: a long sequence's (L, S) masks would not fit."""
    monkeypatch.setattr(attention_masks, "_MAX_BYTES", 32)  # its arange alone holds 64
    gm = _masked_attention_graph(_all_true)
    assert simplify_attention_masks(gm) == 0


def _dropout_kept(q, k, v):
    return F.dropout(torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1), 0.0, False) @ v


def _dropout_eval(q, k, v):
    return torch.dropout(torch.softmax(q @ k.transpose(-2, -1), dim=-1), 0.1, False) @ v


def _dropout_live(q, k, v):
    return F.dropout(torch.softmax(q @ k.transpose(-2, -1), dim=-1), 0.1, True) @ v


def test_a_dropout_that_keeps_every_value_is_stepped_over():
    """timm's attention blocks apply ``attn_drop`` between the softmax and ``@ v``: with
    ``p == 0`` or outside training it is the identity; a live one keeps the pattern."""
    args = _qkv()
    for fn, fused in ((_dropout_kept, 1), (_dropout_eval, 1), (_dropout_live, 0)):
        gm = aten_graph(fn, *args)
        assert fuse_attention(gm) == fused, fn.__name__
        if fused:
            torch.testing.assert_close(gm(*args), fn(*args))


_WINDOWS, _HEADS, _TOKENS = 4, 3, 9


def _swin(q, k, v, bias, window_mask):
    """timm's WindowAttention of a shifted block: q scaled first, a relative position bias,
    then the shift's window mask through a 5-D view of the scores."""
    attn = (q * 0.25) @ k.transpose(-2, -1)
    attn = attn + bias.unsqueeze(0)
    attn = attn.view(-1, _WINDOWS, _HEADS, _TOKENS, _TOKENS) + window_mask.unsqueeze(1).unsqueeze(0)
    attn = attn.view(-1, _HEADS, _TOKENS, _TOKENS)
    return F.dropout(attn.softmax(dim=-1), 0.0, False) @ v


def _swin_without_bias(q, k, v, bias, window_mask):
    attn = q @ k.transpose(-2, -1)
    attn = attn.view(-1, _WINDOWS, _HEADS, _TOKENS, _TOKENS) + window_mask.unsqueeze(1).unsqueeze(0)
    return attn.view(-1, _HEADS, _TOKENS, _TOKENS).softmax(dim=-1) @ v


@pytest.mark.parametrize("fn", [_swin, _swin_without_bias], ids=["bias", "no-bias"])
def test_shifted_window_attention_is_one_fused_call(fn):
    """The window mask repeats over the batch: it is added to the bias into one mask of the
    scores' shape, its rows padded as CUDA's memory-efficient kernel wants them. Values and gradients (the bias is a parameter) match the written-out
    attention."""
    q, k, v = _qkv(b=2 * _WINDOWS, h=_HEADS, t=_TOKENS, s=_TOKENS)
    bias = torch.randn(_HEADS, _TOKENS, _TOKENS)
    window_mask = torch.where(torch.rand(_WINDOWS, _TOKENS, _TOKENS) > 0.3, 0.0, -100.0)
    args = [q, k, v, bias, window_mask]
    gm = aten_graph(fn, *args)
    assert fuse_attention(gm) == 1
    assert not any(n.target in (torch.softmax, F.softmax, "softmax") for n in gm.graph.nodes)
    fused = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    assert fused.kwargs["attn_mask"].target == "narrow"  # rows of 9 written 16 apart
    torch.testing.assert_close(gm(*args), fn(*args))
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    got = torch.autograd.grad(gm(*leaves, window_mask).sum(), leaves, allow_unused=True)
    want = torch.autograd.grad(fn(*leaves, window_mask).sum(), leaves, allow_unused=True)
    torch.testing.assert_close(got, want)


def _expanded_padding_mask(q, k, v, pad):
    """A (B, L) padding mask broadcast to (B, 1, L, L) along its last dim: stride 0 there, as
    HuggingFace's BERT mask has under symbolic sizes."""
    b, _, length, _ = q.shape
    mask = pad[:, None, :, None].expand(b, 1, length, length)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _traced_on(device: str) -> fx.GraphModule:
    """``_expanded_padding_mask`` traced, each node's value a fake on ``device``."""
    gm = fx.symbolic_trace(_expanded_padding_mask)
    q, k, v = _qkv()
    pad = torch.rand(q.shape[0], q.shape[2]) > 0.3
    fakes = {"q": q, "k": k, "v": v, "pad": pad}
    env: dict[str, torch.Tensor] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = fakes[node.name]
        elif node.op != "output":
            args, kwargs = pytree.tree_map(
                lambda a: env[a.name] if isinstance(a, fx.Node) else a, (node.args, node.kwargs)
            )
            if node.op == "call_method":
                env[node.name] = getattr(args[0], node.target)(*args[1:], **kwargs)
            else:
                env[node.name] = node.target(*args, **kwargs)
        if isinstance(env.get(node.name), torch.Tensor):
            node.meta["val"] = (
                to_fake(env[node.name])
                if device == "cpu"
                else FakeTensor(meta_of(to_fake(env[node.name])), torch.device(device))
            )
    return gm


def test_a_cuda_mask_whose_last_dim_is_not_contiguous_is_made_contiguous():
    gm = _traced_on("cuda")
    q, k, v = _qkv()
    pad = torch.rand(q.shape[0], q.shape[2]) > 0.3
    expected = gm(q, k, v, pad)
    assert contiguous_attention_masks(gm) == 1
    call = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    dense = call.kwargs["attn_mask"]
    assert dense.target == "contiguous" and dense.meta["val"].stride(-1) == 1
    torch.testing.assert_close(gm(q, k, v, pad), expected, equal_nan=True)
    assert contiguous_attention_masks(gm) == 0  # once is enough


def test_masks_on_the_cpu_or_already_contiguous_are_left_alone():
    assert contiguous_attention_masks(_traced_on("cpu")) == 0
    gm = fx.symbolic_trace(_expanded_padding_mask)
    assert contiguous_attention_masks(gm) == 0  # no traced values: nothing known


def _hf_bidirectional(q):  # HuggingFace's mask with no padding, over a symbolic length
    n = q.shape[2]
    rows = (torch.arange(n) + 0)[None, None, :, None]
    return (rows >= 0).expand(q.shape[0], -1, n, n)


def _hf_causal(q):
    n = q.shape[2]
    cols = (torch.arange(n) + 0)[None, None, None, :]
    rows = (torch.arange(n) + 0)[None, None, :, None]
    return (cols <= rows).expand(q.shape[0], -1, n, n)


def _causal_strict_and(q):  # kv < q + 1, and a check that always holds
    n = q.shape[2]
    cols, rows = torch.arange(n).unsqueeze(0), torch.arange(n).unsqueeze(1)
    return (cols < rows + 1) & (cols >= -1)


def _float_zeros(q):
    return torch.zeros(1, 1, q.shape[2], q.shape[2])


def _shifted_causal(q):  # one diagonal more: masks less than is_causal
    n = q.shape[2]
    return torch.arange(n)[None, :] <= torch.arange(n)[:, None] + 1


def _first_rows(q):  # true for the first 40 positions only: true at some sizes, not all
    n = q.shape[2]
    return (torch.arange(n) < 40)[None, None, :, None].expand(-1, -1, n, n)


def _from_values(q):
    return q[..., :1] > 0


def _reversed(q):  # q_idx <= kv_idx: the transposed triangle
    n = q.shape[2]
    return torch.arange(n)[:, None] <= torch.arange(n)[None, :]


def _captured_symbolic(make_mask):
    """The torch-level graph of attention with ``make_mask(q)``, captured with every size
    symbolic; the graph as it reaches loopir."""
    from kiln.capture import capture, dynamic_dims
    from kiln.capture.dynamic_dims import DynamicDims

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=make_mask(q))

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    q, k, v = _qkv(t=24, s=24)
    with dynamic_dims.dynamic_dims(DynamicDims(every_size=True)):
        capture(fn, (q, k, v), {}, compile_graph=keep, wrap_callable=lambda f: f, fullgraph=True)
    (gm,) = graphs
    return fn, gm


@pytest.mark.parametrize(
    ("make_mask", "kwargs"),
    [(_hf_bidirectional, {"attn_mask": None}),
     (_hf_causal, {"attn_mask": None, "is_causal": True}),
     (_causal_strict_and, {"attn_mask": None, "is_causal": True}),
     (_float_zeros, {"attn_mask": None})],
    ids=["bidirectional", "causal", "causal-strict-and", "float-zeros"],
)  # fmt: skip
def test_masks_over_symbolic_sizes_are_dropped_or_made_causal_by_rule(make_mask, kwargs):
    """A mask built from positions alone is judged by its rule for every size, not at one."""
    fn, gm = _captured_symbolic(make_mask)
    assert simplify_attention_masks(gm) == 1
    call = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    assert {k: call.kwargs.get(k) for k in kwargs} == kwargs
    assert not any(n.target is torch.arange for n in gm.graph.nodes)  # gone with its use
    for n in (5, 24, 33):
        q, k, v = _qkv(t=n, s=n)
        torch.testing.assert_close(gm(q, k, v)[0], fn(q, k, v))


@pytest.mark.parametrize(
    "make_mask", [_shifted_causal, _first_rows, _from_values, _reversed],
    ids=["shifted", "first-rows", "from-values", "reversed"],
)  # fmt: skip
def test_masks_over_symbolic_sizes_that_mask_are_kept(make_mask):
    _, gm = _captured_symbolic(make_mask)
    assert simplify_attention_masks(gm) == 0
    call = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    assert call.kwargs["attn_mask"] is not None
