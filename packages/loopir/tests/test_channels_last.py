"""NHWC buffers in graphs with convolutions (the CUDA layout optimisation), checked on CPU
by forcing it: same values, NHWC intermediates, no copies anywhere."""

import pytest
import torch
from loopir_testing import aten_graph, suite_backend, to_meta

from kiln.capture import counters
from kiln.loopir import BackendTraits, ReferenceBackend
from kiln.loopir.ir.buffers import ExternBuffer
from kiln.loopir.layout_choice import prefers_channels_last
from kiln.loopir.lowering.fallback import _nhwc_if_conv_would_be
from kiln.loopir.pipeline import compile_graph

aten = torch.ops.aten
CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def conv_net(x, w1, w2, scale, lin):
    """Stem, pooled block with a residual add, global pool and a classifier."""
    y = aten.convolution.default(x, w1, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    y = aten.relu.default(aten.mul.Tensor(y, scale))
    y = aten.max_pool2d_with_indices.default(y, [3, 3], [2, 2], [1, 1])[0]
    z = aten.convolution.default(y, w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    z = aten.relu.default(aten.add.Tensor(z, y))
    pooled = aten.mean.dim(z, [2, 3])
    return (aten.mm.default(pooled, lin),)


def conv_net_features(x, w1, w2, scale, lin):
    """The same net returning its last feature map (NCHW, like a saved activation)."""
    y = aten.convolution.default(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return (aten.relu.default(y),)


def deep_features(x, w1, w2, scale, lin):
    """Three convolutions returning the last feature map only (an encoder's last hidden
    state): one copy of it to NCHW moves less than cuDNN's transposes around each one."""
    y = aten.relu.default(
        aten.convolution.default(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    )
    for _ in range(2):
        y = aten.relu.default(
            aten.convolution.default(y, w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        )
    return (y,)


def saved_activations(x, w1, w2, scale, lin):
    """A training forward's shape: every convolution's input and output returned NCHW."""
    y = aten.convolution.default(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    r = aten.relu.default(y)
    z = aten.convolution.default(r, w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return (y, r, z, aten.relu.default(z))


def grouped_conv_net(x, w1, w2, scale, lin):
    """A depthwise-separable block (MobileNet's): a grouped convolution, then a dense 1x1."""
    y = aten.convolution.default(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    y = aten.convolution.default(y, w2[:, :1], None, [1, 1], [1, 1], [1, 1], False, [0, 0], 8)
    return (aten.mm.default(aten.mean.dim(y, [2, 3]), lin),)


def _inputs():
    return (
        torch.randn(2, 3, 16, 16),
        torch.randn(8, 3, 3, 3),
        torch.randn(8, 8, 3, 3),
        torch.randn(1, 8, 1, 1),
        torch.randn(8, 5),
    )


@pytest.mark.parametrize(
    ("fn", "device", "want"),
    [
        (conv_net, CUDA, True),
        (conv_net, CPU, False),  # dense convolutions: oneDNN is no faster in NHWC
        (grouped_conv_net, CPU, torch.backends.mkldnn.is_available()),
        (conv_net_features, CUDA, False),
        (conv_net_features, CPU, False),
        (deep_features, CUDA, True),
        (saved_activations, CUDA, False),
    ],
    ids=[
        "cuda",
        "cpu",
        "cpu-grouped",
        "nchw-output",
        "nchw-output-cpu",
        "deep-nchw-output",
        "saved-activations",
    ],  # fmt: skip
)
def test_which_graphs_prefer_channels_last(fn, device, want):
    assert prefers_channels_last(aten_graph(fn, *_inputs()), device) is want


def packed_conv_then_products(x, w1, w2, scale, lin):
    """A convolution freezing prepacked (oneDNN answers NHWC), then more matrix products than
    convolutions: a stem before a transformer."""
    y = torch.ops.mkldnn._convolution_pointwise.default(
        x, w1, None, [1, 1], [1, 1], [1, 1], 1, "relu", [], ""
    )
    t = aten.view.default(aten.permute.default(y, [0, 2, 3, 1]), [512, 8])
    for _ in range(3):
        t = aten.mm.default(t, lin.new_ones(8, 8))
    return (t,)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN missing")
def test_a_cpu_graph_with_a_prepacked_convolution_goes_channels_last():
    gm = aten_graph(packed_conv_then_products, *_inputs())
    assert sum(n.target == aten.mm.default for n in gm.graph.nodes) == 3
    assert prefers_channels_last(gm, CPU) is True


def test_no_convolution_no_channels_last():
    gm = aten_graph(lambda x: (aten.relu.default(x),), torch.randn(2, 3, 4, 4))
    assert prefers_channels_last(gm, CUDA) is False


def _forced(fn, inputs, gm=None):
    """``fn`` compiled with NHWC forced (the CUDA layout, here on CPU), equal to eager."""
    counters.clear()
    gm = gm if gm is not None else aten_graph(fn, *inputs)
    compiled = compile_graph(
        gm, [to_meta(t) for t in inputs], backend=suite_backend(), channels_last=True
    )
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), atol=1e-4, rtol=1e-4)
    return compiled


def test_forced_channels_last_matches_eager_with_nhwc_buffers_and_no_copies():
    inputs = _inputs()
    compiled = _forced(conv_net, inputs)
    four_d = [
        s.group.buffers[n]
        for s in compiled.steps
        if hasattr(s, "group")
        for n in s.group.outputs
        if len(s.group.buffers[n].size) == 4
    ]
    assert four_d
    for layout in four_d:
        n, c, h, w = (int(v) for v in layout.size)
        assert tuple(int(v) for v in layout.stride) == (h * w * c, 1, w * c, c)
    snapshot = counters.snapshot()
    assert "extern_copies" not in snapshot and "output_copies" not in snapshot


def convnext_block(x, wdw, lnw, lnb, w1, b1, w2, b2):
    """ConvNeXt's block: depthwise convolution, then LayerNorm and an MLP over NHWC."""
    c = x.shape[1]
    y = aten.convolution.default(x, wdw, None, [1, 1], [3, 3], [1, 1], False, [0, 0], c)
    y = aten.native_layer_norm.default(aten.permute.default(y, [0, 2, 3, 1]), [c], lnw, lnb, 1e-6)
    n, h, w, _ = y[0].shape
    y = aten.addmm.default(b1, aten.view.default(y[0], [n * h * w, c]), aten.t.default(w1))
    y = aten.addmm.default(b2, aten.gelu.default(y), aten.t.default(w2))
    y = aten.permute.default(aten.view.default(y, [n, h, w, c]), [0, 3, 1, 2])
    return (aten.add.Tensor(x, y),)


def test_a_buffer_read_in_another_dim_order_is_laid_out_in_that_order():
    """The LayerNorm over ``x.permute(0, 2, 3, 1)`` is stored row-major (N, H, W, C), in
    the order it reads: the MLP's matrix product takes it as a plain view, with no copy.
    An NHWC layout of that (N, H, W, C) tensor would put H innermost."""
    c = 8
    x = torch.randn(2, c, 6, 5).contiguous(memory_format=torch.channels_last)
    inputs = (x, torch.randn(c, 1, 7, 7), torch.randn(c), torch.randn(c))
    inputs += (torch.randn(4 * c, c), torch.randn(4 * c), torch.randn(c, 4 * c), torch.randn(c))
    compiled = _forced(convnext_block, inputs)
    written = [
        s.group.buffers[n] for s in compiled.steps if hasattr(s, "group") for n in s.group.outputs
    ]
    normed, out = (b for b in written if len(b.size) == 4)  # LayerNorm's, the block's
    assert [int(v) for v in normed.stride] == [6 * 5 * c, 5 * c, c, 1]
    assert [int(v) for v in out.stride] == [6 * 5 * c, 1, 5 * c, c]
    # no kernel copies the LayerNorm's result into a (N*H*W, C) matrix for the product
    assert not any([int(v) for v in b.size] == [2 * 6 * 5, c] for b in written)


def linear_attention_heads(x, w, w2):
    """EfficientViT's linear attention reads the ``cat`` of two convolutions' (B, C, H, W)
    outputs as (B, heads, H*W, d): a view that splits H*W back apart in the read's index."""
    a = aten.convolution.default(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    b = aten.convolution.default(a, w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 48)
    n, c, h, wd = a.shape
    qkv = aten.view.default(aten.cat.default([a, b], 1), [n, 2 * c // 24, 24, h * wd])
    q, k, v = aten.split.Tensor(aten.transpose.int(qkv, -1, -2), 8, -1)
    kv = aten.add.Tensor(aten.relu.default(k), v)
    return aten.sort.default(aten.relu.default(q), 3)[0], aten.sort.default(kv, 3)[0]


def test_a_read_through_a_split_view_is_laid_out_in_its_order():
    """The queries read steps (2C*H*W, 24, 2C, 1) along (B, heads, H*W, d) once H*W's
    split digits are rejoined: stored in that order (B, H*W, heads, d), not NHWC (heads
    innermost, d strided)."""
    inputs = (torch.randn(2, 8, 7, 7), torch.randn(48, 8, 1, 1), torch.randn(48, 1, 3, 3))
    compiled = _forced(linear_attention_heads, inputs)
    written = [
        s.group.buffers[n]
        for s in compiled.steps
        if hasattr(s, "group") and "output relayout" not in s.group.origins()
        for n in s.group.outputs
        if [int(v) for v in s.group.buffers[n].size] == [2, 4, 49, 8]
    ]
    assert len(written) == 2  # relu(q), relu(k) + v
    for b in written:
        assert [int(v) for v in b.stride] == [4 * 49 * 8, 8, 4 * 8, 1]


def test_an_nchw_image_is_copied_channels_last_before_the_stem():
    compiled = _forced(conv_net, _inputs())
    first = next(s for s in compiled.steps if hasattr(s, "group"))
    assert [n.origin for n in first.group.nodes] == ["channels-last convolution input"]


class _WeightNHWCBackend(ReferenceBackend):
    """The reference backend asking for channels-last convolution weights, as Triton's does."""

    traits = BackendTraits(convolution_weight_nhwc=True)


def test_weights_are_copied_channels_last_where_the_backend_asks():
    """Both 3x3 weights of ``conv_net`` are copied NHWC by kernels of the graph (ATen's cuDNN
    path would copy them on every call itself); the image too, as without the trait."""
    inputs = _inputs()
    gm = aten_graph(conv_net, *inputs)
    compiled = compile_graph(
        gm, [to_meta(t) for t in inputs], backend=_WeightNHWCBackend(), channels_last=True
    )
    torch.testing.assert_close(compiled(*inputs), conv_net(*inputs), atol=1e-4, rtol=1e-4)
    copied = [
        s.reads
        for s in compiled.steps
        if hasattr(s, "group") and s.group.nodes[0].origin == "channels-last convolution input"
    ]
    assert sorted(copied) == sorted([frozenset({"x"}), frozenset({"w1"}), frozenset({"w2"})])


class _LibraryDepthwiseBackend(ReferenceBackend):
    """The reference backend leaving depthwise convolutions to the library, as every backend
    leaves their backward."""

    traits = BackendTraits(lowered_depthwise=False)


class _DepthwiseNHWCBackend(ReferenceBackend):
    """The same, asking for NHWC depthwise convolutions, as Triton's does for their backward."""

    traits = BackendTraits(depthwise_nhwc=True, lowered_depthwise=False)


def depthwise_step(x, w, scale, grad):
    """A depthwise convolution after a pointwise op, and its backward (a training graph)."""
    y = aten.mul.Tensor(x, scale)
    out = aten.convolution.default(y, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 8)
    back = aten.convolution_backward.default(
        aten.mul.Tensor(grad, scale), y, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 8,
        [True, True, False],
    )  # fmt: skip
    return (out, aten.mul.Tensor(back[0], scale), back[1])


@pytest.mark.parametrize("wanted", [True, False])
def test_depthwise_backward_activations_are_nhwc_where_the_backend_asks(wanted):
    """Not a channels-last graph (its outputs are NCHW), yet a depthwise convolution's
    backward gets NHWC activations when the backend sets ``depthwise_nhwc``; the forward
    keeps NCHW."""
    inputs = (torch.randn(2, 8, 6, 5), torch.randn(8, 1, 3, 3), torch.randn(1, 8, 1, 1))
    inputs += (torch.randn(2, 8, 6, 5),)
    counters.clear()
    backend = _DepthwiseNHWCBackend() if wanted else _LibraryDepthwiseBackend()
    gm = aten_graph(depthwise_step, *inputs)
    compiled = compile_graph(gm, [to_meta(t) for t in inputs], backend=backend)
    for got, want in zip(compiled(*inputs), depthwise_step(*inputs), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    copies = [
        n.origin
        for s in compiled.steps
        if hasattr(s, "group")
        for n in s.group.nodes
        if n.origin == "channels-last convolution input"
    ]
    # the input, stored NCHW for the forward, is copied; the gradient, not stored yet, is
    # stored NHWC by the kernel that computes it
    assert len(copies) == (1 if wanted else 0)
    written = [
        tuple(int(v) for v in s.group.buffers[n].stride)
        for s in compiled.steps
        if hasattr(s, "group")
        for n in s.group.outputs
    ]
    assert written.count((240, 1, 40, 8)) == (2 if wanted else 0)  # the copy, the gradient
    snapshot = counters.snapshot()
    assert "extern_copies" not in snapshot and "output_copies" not in snapshot


def test_convolution_gradients_follow_input_and_weight_not_grad_output():
    """Swin's stem permutes its convolution's output NHWC, so the gradient reaching the
    backward is NHWC while the image and weight are NCHW: ATen answers NCHW gradients, and
    so must the plan, even where torch's meta function (before 2.14) followed grad_output."""
    grad = torch.randn(2, 4, 4, 6).permute(0, 3, 1, 2)  # NHWC strides
    x, w = torch.randn(2, 3, 16, 16), torch.randn(6, 3, 4, 4)
    args = ([6], [4, 4], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True])
    meta = [to_meta(t) for t in (grad, x, w)]
    older = tuple(  # what the older meta answered
        t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
        for t in aten.convolution_backward.default(*meta, *args)
    )
    planned = _nhwc_if_conv_would_be(aten.convolution_backward.default, meta, older)
    real = aten.convolution_backward.default(grad, x, w, *args)
    assert [t.stride() for t in planned] == [t.stride() for t in real]
    assert planned[1].is_contiguous()

    def fn(grad, x, w):
        return aten.convolution_backward.default(grad, x, w, *args)

    counters.clear()
    gm = aten_graph(fn, grad, x, w)
    compiled = compile_graph(gm, [to_meta(t) for t in (grad, x, w)], backend=ReferenceBackend())
    for got, want in zip(compiled(grad, x, w), fn(grad, x, w), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert "extern_copies" not in counters.snapshot()


def padded_bias_attention(q, k, v, table):
    """Swin's position bias (gathered keys-first, heads last, then permuted) padded to
    8-element rows, as ATen's CUDA attention pads its mask."""
    bias = aten.permute.default(aten.mul.Tensor(table, 2.0), [2, 0, 1])
    bias = aten.unsqueeze.default(bias, 0)
    mask = aten.slice.Tensor(aten.constant_pad_nd.default(bias, [0, 7], 0.0), -1, 0, 9)
    mask = aten.expand.default(mask, [3, 2, 9, 9])
    return (aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, attn_mask=mask)[0],)


def test_an_attention_mask_is_stored_with_rows_innermost():
    """Fused attention kernels need their operands' last dim contiguous: the padded bias
    is stored row-major (1, 2, 9, 16), never NHWC, in a channels-last graph."""
    q, k, v = (torch.randn(3, 2, 9, 4) for _ in range(3))
    compiled = _forced(padded_bias_attention, (q, k, v, torch.randn(9, 9, 2)))
    (padded,) = (
        s.group.buffers[n] for s in compiled.steps if hasattr(s, "group") for n in s.group.outputs
    )
    assert [int(v) for v in padded.size] == [1, 2, 9, 16]
    assert [int(v) for v in padded.stride] == [2 * 9 * 16, 9 * 16, 16, 1]


def shared_bias_attention(q, k, v, table, index):
    """A relative-position bias shared by twelve attention blocks (timm's ``vit_srelpos``):
    gathered keys-first with heads last, permuted, then made contiguous. Read that often,
    the clone is stored where it is computed, in the order it reads its source: heads
    innermost."""
    heads = table.shape[1]
    bias = aten.index.Tensor(table, [index])  # (L * L, heads)
    bias = aten.view.default(bias, [q.shape[2], q.shape[2], heads])
    bias = aten.unsqueeze.default(aten.permute.default(bias, [2, 0, 1]), 0)
    mask = aten.clone.default(bias, memory_format=torch.contiguous_format)
    attend = aten._scaled_dot_product_flash_attention_for_cpu.default
    for _ in range(12):
        q = attend(q, k, v, attn_mask=mask)[0]
    return (q,)


def test_an_attention_mask_stored_heads_innermost_reaches_attention_row_major():
    """A mask already stored when attention reads it (a clone's result, laid out NHWC in a
    channels-last graph) reaches every attention call row-major, copied once: cuDNN's
    attention faults on a mask whose last dim is not contiguous rather than refusing it."""
    q, k, v = (torch.randn(2, 3, 9, 4) for _ in range(3))
    inputs = (q, k, v, torch.randn(20, 3), torch.randint(0, 20, (81,)))
    compiled = _forced(shared_bias_attention, inputs)
    externs = [
        s.buffer for s in compiled.steps if isinstance(getattr(s, "buffer", None), ExternBuffer)
    ]
    masks = [b.kwargs["attn_mask"] for b in externs if "attn_mask" in b.kwargs]
    assert len(masks) == 12
    assert len({m.get_name() for m in masks}) == 1
    assert [int(n) for n in masks[0].layout.stride] == [3 * 81, 81, 9, 1]
    assert "extern_copies" not in counters.snapshot()


def layernorm2d_then_conv(x, lnw, lnb, w):
    """poolformerv2's downsampling: LayerNorm over C of ``x.permute(0, 2, 3, 1)``, permuted
    back (eager's strides NHWC from here on), an affine step read twice, a convolution."""
    c = x.shape[1]
    y = aten.native_layer_norm.default(aten.permute.default(x, [0, 2, 3, 1]), [c], lnw, lnb, 1e-6)
    y = aten.add.Tensor(aten.mul.Tensor(aten.permute.default(y[0], [0, 3, 1, 2]), 2.0), 1.0)
    pooled = aten.avg_pool2d.default(y, [3, 3], [1, 1], [1, 1], False, False)
    z = aten.add.Tensor(aten.sub.Tensor(pooled, y), y)
    conv = aten.convolution.default(z, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    return (aten.relu.default(conv), aten.sum.default(z))


@pytest.mark.parametrize("nhwc_input", [False, True])
def test_values_eager_lays_out_nhwc_are_stored_nchw_in_an_nchw_graph(nhwc_input):
    """Without a channels-last input or output, the values after a permuted LayerNorm that
    eager keeps NHWC are stored NCHW: the pooling, the reduction and the convolution (which
    answers NCHW) walk one layout. A channels-last input keeps eager's strides."""
    c = 8
    x = torch.randn(2, c, 6, 5)
    if nhwc_input:
        x = x.contiguous(memory_format=torch.channels_last)
    inputs = (x, torch.randn(c), torch.randn(c), torch.randn(16, c, 1, 1))
    counters.clear()
    compiled = compile_graph(
        aten_graph(layernorm2d_then_conv, *inputs), [to_meta(t) for t in inputs]
    )
    for got, want in zip(compiled(*inputs), layernorm2d_then_conv(*inputs), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    written = [
        s.group.buffers[n] for s in compiled.steps if hasattr(s, "group") for n in s.group.outputs
    ]
    nchw = [b for b in written if [int(v) for v in b.size] == [2, c, 6, 5]]
    assert nchw
    contiguous = [tuple(int(v) for v in b.stride) == (c * 30, 30, 5, 1) for b in nchw]
    assert all(contiguous) if not nhwc_input else not any(contiguous)
    assert "extern_copies" not in counters.snapshot()


def test_an_nchw_output_of_an_nhwc_graph_comes_back_nchw():
    """The returned feature map has eager's NCHW strides: its last pointwise kernel writes
    it so, reading the NHWC convolution output, with no copy."""
    compiled = _forced(deep_features, _inputs())
    (out,) = compiled(*_inputs())
    assert out.is_contiguous()
    assert "output_copies" not in counters.snapshot()


def nhwc_chain(x, w1, w2):
    """A convolution of an NHWC input (it answers NHWC), GELU, then another convolution: an
    MBConv block after a LayerNorm over a permutation, in a graph kept NCHW."""
    y = aten.convolution.default(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    z = aten.convolution.default(
        aten.gelu.default(y), w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1
    )
    return (aten.mean.dim(z, [2, 3]),)


def test_a_convolution_input_is_stored_in_the_order_it_reads_its_source():
    """The GELU between the two convolutions is stored NHWC, as its source is, not NCHW by a
    transposing gather."""
    x = torch.randn(2, 4, 6, 5).contiguous(memory_format=torch.channels_last)
    inputs = (x, torch.randn(8, 4, 3, 3), torch.randn(8, 8, 3, 3))
    gm = aten_graph(nhwc_chain, *inputs)
    compiled = compile_graph(
        gm, [to_meta(t) for t in inputs], backend=suite_backend(), channels_last=False
    )
    torch.testing.assert_close(compiled(*inputs), nhwc_chain(*inputs), atol=1e-4, rtol=1e-4)
    (gelu,) = [
        s.group.buffers[n]
        for s in compiled.steps
        if hasattr(s, "group")
        for n in s.group.outputs
        if len(s.group.buffers[n].size) == 4
    ]
    assert tuple(int(v) for v in gelu.stride) == (6 * 5 * 8, 1, 5 * 8, 8)
