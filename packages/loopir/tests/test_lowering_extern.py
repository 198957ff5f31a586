"""Extern kernels (ATen calls from the wrapper) with generated kernels around them."""

import torch
from loopir_testing import aten_graph, check, to_meta

from kiln.capture import counters
from kiln.loopir import BackendTraits, ReferenceBackend, compile_graph
from kiln.loopir.lowering.fallback import is_vendor_kernel
from kiln.loopir.pipeline import CompiledGraph, KernelStep
from kiln.loopir.scheduler.order import ExternStep
from kiln.loopir.wrapper import _binding

aten = torch.ops.aten


def test_matmuls_and_convolutions():
    a, b, bias = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    ba, bb, base = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(2, 3, 5)
    img, k = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    go = torch.randn(1, 3, 6, 6)

    def fn(a, b, bias, ba, bb, base, img, k, go):
        conv_args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        grads = aten.convolution_backward.default(go, img, k, [3], *conv_args, [True, True, True])
        return (
            aten.mm.default(aten.mul.Scalar(a, 2.0), b),
            aten.addmm.default(bias, a, b, beta=0.5, alpha=2.0),
            aten.bmm.default(ba, bb),
            aten.baddbmm.default(base, ba, bb),
            aten.convolution.default(img, k, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1),
            grads[0],
            grads[1],
            grads[2],
        )

    compiled = check(fn, a, b, bias, ba, bb, base, img, k, go, atol=1e-4, rtol=1e-4)
    # torch's own bindings where they must run the same overload (C++ argument parsing, not
    # the OpOverload's boxed path); convolution_backward has none
    called = {v for v in compiled.wrapper.globals.values() if callable(v)}
    assert {torch.mm, torch.addmm, torch.bmm, torch.baddbmm, torch.convolution} <= called
    assert aten.convolution_backward.default in called


def test_products_of_one_shape_run_their_meta_kernel_once(monkeypatch):
    """The planned layout of an extern's result comes from its meta kernel, which for ``addmm``
    is a Python decomposition; layers of one shape share one run."""
    from kiln.loopir.lowering import fallback

    monkeypatch.setattr(fallback, "_META_RESULTS", {})
    runs = []
    addmm = aten.addmm.default

    class Counted:
        def __getattr__(self, name):
            return getattr(addmm, name)

        def __call__(self, *args, **kwargs):
            runs.append([a.device.type for a in args if isinstance(a, torch.Tensor)])
            return addmm(*args, **kwargs)

    x, w, b = torch.randn(6, 8), torch.randn(8, 8), torch.randn(8)

    def fn(x, w, b):
        h = x
        for _ in range(3):
            h = aten.relu.default(aten.addmm.default(b, h, w))
        return (h, aten.addmm.default(b, x, aten.t.default(w)))

    counted = Counted()
    for _ in range(2):
        found = fallback._meta_result(counted, (to_meta(b), to_meta(x), to_meta(w)), {})
    assert runs == [["meta"] * 3] and found.shape == (6, 8)
    check(fn, x, w, b, atol=1e-4, rtol=1e-4)
    # one run per layout of the arguments: h @ w three times, x @ w.t() once more
    assert len(fallback._META_RESULTS) == 3


def test_extern_bindings_only_where_no_other_overload_fits():
    assert _binding(aten.convolution.default, []) is torch.convolution
    assert _binding(aten.addmm.default, ["beta", "alpha"]) is torch.addmm
    # self is positional in the schema and named input in the binding
    assert _binding(aten.addmm.default, ["self"]) is aten.addmm.default
    # index_put.hacked_twin takes the default's arguments: the binding might pick it
    assert _binding(aten.index_put.default, []) is aten.index_put.default
    assert _binding(aten.add.Tensor, []) is aten.add.Tensor
    assert _binding(aten.convolution_backward.default, []) is aten.convolution_backward.default
    # torch.nn.functional's own ops bind in torch._C._nn
    assert (
        _binding(aten.max_pool2d_with_indices.default, []) is torch._C._nn.max_pool2d_with_indices
    )


def test_decomposed_former_externs_do_not_fall_back():
    """Group norm and upsampling reach loopir as their decompositions (pooling has its
    own lowerings, ``test_lowering_pooling.py``)."""
    img = torch.randn(2, 4, 6, 6)
    w, bias = torch.randn(4), torch.randn(4)
    g = torch.randn(2, 4, 6, 6)

    def fn(img, w, bias, g):
        gn = aten.native_group_norm.default(img, w, bias, 2, 4, 36, 2, 1e-5)
        back = aten.native_group_norm_backward.default(
            g, img, gn[1], gn[2], w, 2, 4, 36, 2, [True, True, True]
        )
        return (
            gn[0],
            gn[1],
            gn[2],
            back[0],
            back[1],
            back[2],
            aten.upsample_nearest2d.default(img, [12, 12]),
            aten.upsample_nearest2d.vec(img, None, [2.0, 2.0]),
            aten.upsample_bilinear2d.default(img, [9, 9], False),
            aten.upsample_bilinear2d.vec(img, [4, 4], True, None),
        )

    counters.clear()
    c = check(fn, img, w, bias, g, atol=1e-4, rtol=1e-4)
    assert "fallback_ops" not in counters.snapshot()
    assert not [s for s in c.steps if isinstance(s, ExternStep)]


def test_fallbacks_are_counted_and_vendor_kernels_are_not():
    x = torch.randn(4, 7)
    a, b = torch.randn(3, 4), torch.randn(4, 5)

    def fn(x, a, b):
        srt = aten.sort.default(x, 1, True)
        stable = aten.sort.stable(x, stable=True, dim=0)
        top = aten.topk.default(x, 3)
        return (
            srt[0],
            srt[1],
            stable[0],
            top[0],
            aten.add.Tensor(top[1], 1),
            aten._cdist_forward.default(x, x, 2.0, None),
            aten.mm.default(a, b),
        )

    counters.clear()
    c = check(fn, x, a, b, atol=1e-4, rtol=1e-4)
    snap = counters.snapshot()
    assert snap["fallback_ops"] == {
        "aten.sort.default": 1,
        "aten.sort.stable": 1,
        "aten.topk.default": 1,
        "aten._cdist_forward.default": 1,
    }
    assert snap["extern_kernels"] == {"aten.mm.default": 1}
    externs = [s.buffer for s in c.steps if isinstance(s, ExternStep)]
    assert [is_vendor_kernel(e.op) for e in externs].count(True) == 1
    assert [e.fallback for e in externs].count(True) == 4
    assert [s for s in c.steps if isinstance(s, KernelStep)]  # the add epilogue


def test_vendor_kernels_are_named():
    for name in ("mm", "addmm", "convolution_backward", "_scaled_dot_product_flash_attention"):
        assert is_vendor_kernel(getattr(aten, name).default)
    for name in ("_scaled_dot_product_efficient_attention_backward", "bmm"):
        assert is_vendor_kernel(getattr(aten, name).default)
    assert not is_vendor_kernel(aten.sort.default)
    assert not is_vendor_kernel(aten.max_pool2d_with_indices.default)


def test_attention_extern():
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))

    def fn(q, k, v):
        out = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, scale=0.5)
        return (aten.mul.Scalar(out[0], 2.0),)

    check(fn, q, k, v, atol=1e-5, rtol=1e-5)


def test_legacy_convolution_extern():
    import pytest

    img, k = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)

    def fn(img, k):
        args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1, False, False, False, True)
        return (aten.relu.default(aten._convolution.default(img, k, None, *args)),)

    try:
        check(fn, img, k, atol=1e-5, rtol=1e-5)
    except NotImplementedError:
        pytest.skip("this torch has no meta kernel for _convolution")


def test_extern_output_strides_differ_from_traced_ones():
    """The CPU attention kernel's output strides follow its inputs', which loopir lays
    out afresh: the wrapper must give the result the planned strides (MHA regression)."""
    x = torch.randn(5, 2, 3, 16)

    def fn(x):
        qkv = aten.permute.default(aten.mul.Tensor(x, 0.5), [2, 1, 0, 3])
        heads = [aten.view.default(aten.select.int(qkv, 0, i), [2, 5, 4, 4]) for i in range(3)]
        q, k, v = (aten.permute.default(h, [0, 2, 1, 3]) for h in heads)
        out = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, is_causal=True)
        merged = aten.clone.default(aten.permute.default(out[0], [2, 0, 1, 3]))
        return aten.add.Tensor(aten.view.default(merged, [10, 16]), 1.0), out[1]

    check(fn, x, atol=1e-5, rtol=1e-5)


def test_planned_extern_strides_need_no_copy():
    """Attention on heads split out of a transposed projection (MHA's layout): the views
    stay strided windows on the projection (no copy kernel), the attention output gets
    the strides the kernel really produces, and the wrapper's safety net never copies."""
    x, w = torch.randn(30, 32), torch.randn(96, 32)

    def fn(x, w):
        qkv = aten.view.default(aten.mm.default(x, aten.t.default(w)), [10, 3, 3, 32])
        heads = aten.clone.default(
            aten.permute.default(qkv, [2, 0, 1, 3]), memory_format=torch.contiguous_format
        )
        q, k, v = (
            aten.view.default(
                aten.transpose.int(
                    aten.view.default(aten.select.int(heads, 0, i), [10, 12, 8]), 0, 1
                ),
                [3, 4, 10, 8],
            )
            for i in range(3)
        )
        out = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v)
        flat = aten.view.default(aten.permute.default(out[0], [2, 0, 1, 3]), [30, 32])
        return aten.mm.default(flat, aten.slice.Tensor(w, 0, 0, 32)), out[1]

    counters.clear()
    c = check(fn, x, w, atol=1e-5, rtol=1e-5)
    assert "extern_copies" not in counters.snapshot()
    assert c.kernel_count == 1  # the clone; q, k, v and flat are views


def test_extern_inputs_and_saved_values_keep_eager_strides():
    """A pointwise value on transposed heads (Llama's rotary embedding), read by attention
    and returned (saved for the backward): stored with eager's strides, so neither the
    attention result nor the returned value needs a copy to its traced strides."""
    x = torch.randn(2, 10, 4, 8)

    def fn(x):
        q = aten.add.Tensor(aten.mul.Tensor(aten.transpose.int(x, 1, 2), 0.5), 1.0)
        q = aten.add.Tensor(aten.mul.Tensor(q, q), q)  # enough work to be stored once
        out = aten._scaled_dot_product_flash_attention_for_cpu.default(q, q, q)
        return out[0], q

    counters.clear()
    c = check(fn, x, atol=1e-5, rtol=1e-5)
    snap = counters.snapshot()
    assert "output_copies" not in snap and "extern_copies" not in snap, snap
    assert c(x)[1].stride() == fn(x)[1].stride()


def test_batched_matmul_reads_heads_cloned_contiguous_as_views():
    """Eager attention clones transposed heads, then views them as (B*H, S, D) for
    ``bmm``: the clone's buffer is read in place, not copied again."""
    x = torch.randn(2, 5, 12)

    def fn(x):
        heads = aten.transpose.int(aten.view.default(x, [2, 5, 3, 4]), 1, 2)
        q = aten._unsafe_view.default(
            aten.clone.default(heads, memory_format=torch.contiguous_format), [6, 5, 4]
        )
        kt = aten.transpose.int(aten.view.default(heads, [2, 3, 5, 4]), 2, 3)
        k = aten._unsafe_view.default(
            aten.clone.default(kt, memory_format=torch.contiguous_format), [6, 4, 5]
        )
        scores = aten.view.default(aten.bmm.default(q, k), [2, 3, 5, 5])
        probs = aten._softmax.default(scores, -1, False)
        return aten.bmm.default(aten.view.default(probs, [6, 5, 5]), q)

    c = check(fn, x, atol=1e-5, rtol=1e-5)
    assert c.kernel_count == 2  # the clones (one kernel) and the softmax


class _BiasAfter(ReferenceBackend):
    """The reference backend asking for convolution biases as pointwise adds, as Triton's does."""

    traits = BackendTraits(convolution_bias_pointwise=True)


def test_convolution_bias_joins_the_kernel_after_it_where_the_backend_asks():
    img, k, bias = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4)

    def fn(img, k, bias):
        conv = aten.convolution.default(img, k, bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return (aten.relu.default(conv),)

    gm = aten_graph(fn, img, k, bias)
    compiled = compile_graph(gm, [to_meta(t) for t in (img, k, bias)], backend=_BiasAfter())
    torch.testing.assert_close(compiled(img, k, bias), fn(img, k, bias), atol=1e-5, rtol=1e-5)
    (extern,) = [s.buffer for s in compiled.steps if isinstance(s, ExternStep)]
    assert extern.args[2] is None  # the library convolves without the bias
    assert sum(isinstance(s, KernelStep) for s in compiled.steps) == 1  # bias add and relu


class _MatmulBiasAfter(ReferenceBackend):
    """The reference backend asking for an addmm's bias as a pointwise add, as Triton's does."""

    traits = BackendTraits(matmul_bias_pointwise=True)


def _extern_ops(compiled: CompiledGraph) -> list[str]:
    return [str(s.buffer.op) for s in compiled.steps if isinstance(s, ExternStep)]


def test_addmm_read_by_pointwise_ops_leaves_its_bias_to_their_kernel():
    x, w, bias = torch.randn(6, 8), torch.randn(5, 8), torch.randn(5)

    def fn(x, w, bias):
        out = aten.addmm.default(bias, x, aten.t.default(w))
        return (aten.gelu.default(aten.view.default(out, [2, 3, 5])),)

    gm = aten_graph(fn, x, w, bias)
    metas = [to_meta(t) for t in (x, w, bias)]
    compiled = compile_graph(gm, metas, backend=_MatmulBiasAfter())
    torch.testing.assert_close(compiled(x, w, bias), fn(x, w, bias), atol=1e-5, rtol=1e-5)
    assert _extern_ops(compiled) == ["aten.mm.default"]
    assert sum(isinstance(s, KernelStep) for s in compiled.steps) == 1  # bias add and gelu
    # without the trait the library adds the bias
    plain = compile_graph(aten_graph(fn, x, w, bias), metas, backend=ReferenceBackend())
    assert _extern_ops(plain) == ["aten.addmm.default"]


def test_addmm_returned_or_scaled_keeps_its_bias_in_the_library():
    x, w, bias = torch.randn(6, 8), torch.randn(5, 8), torch.randn(5)

    def returned(x, w, bias):
        out = aten.addmm.default(bias, x, aten.t.default(w))
        return (out, aten.relu.default(out))

    def scaled(x, w, bias):
        out = aten.addmm.default(bias, x, aten.t.default(w), beta=0.5)
        return (aten.relu.default(out),)

    for fn in (returned, scaled):
        gm = aten_graph(fn, x, w, bias)
        compiled = compile_graph(gm, [to_meta(t) for t in (x, w, bias)], backend=_MatmulBiasAfter())
        torch.testing.assert_close(compiled(x, w, bias), fn(x, w, bias), atol=1e-5, rtol=1e-5)
        assert _extern_ops(compiled) == ["aten.addmm.default"]


@torch.library.custom_op("kiln_test::half_then_float", mutates_args=())
def _half_then_float(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).to(torch.bfloat16)  # the real kernel answers bfloat16


@_half_then_float.register_fake
def _(x):
    return torch.empty_like(x)  # its meta function says float32


def test_an_extern_result_of_another_dtype_than_its_meta_says_is_converted():
    """A kernel and its meta function disagreeing on a result's dtype (CPU batch norm's
    statistics) would have the next kernel read bfloat16 bits as float32: the wrapper
    converts the result, counts it and warns."""
    x = torch.randn(6)

    def fn(x):
        return aten.add.Tensor(torch.ops.kiln_test.half_then_float.default(x), 1)

    counters.clear()
    compiled = compile_graph(aten_graph(fn, x), [to_meta(x)], backend=ReferenceBackend())
    out = compiled(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, (x * 2).to(torch.bfloat16).float() + 1)
    assert counters.snapshot()["extern_copies"] == {"kiln_test.half_then_float.default": 1}


def test_convolution_result_planned_as_aten_lays_it_out():
    """A batch of one permuted from NHWC reaches the convolution as a view with stride 0
    on N, which ATen's ``suggest_memory_format`` calls NCHW (it answers NCHW): planned
    so, the result needs no copy. A 1x1 weight stored channels-last makes it NHWC."""
    x = torch.randn(1, 8, 8, 4)
    w = torch.randn(6, 4, 3, 3)

    def fn(x, w):
        y = aten.permute.default(aten.add.Tensor(aten.mul.Tensor(x, x), 1.0), [0, 3, 1, 2])
        conv = aten.convolution.default(y, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return (aten.relu.default(conv),)

    counters.clear()
    check(fn, x, w, atol=1e-5, rtol=1e-5)
    assert "extern_copies" not in counters.snapshot()

    w1 = torch.randn(6, 4, 1, 1).contiguous(memory_format=torch.channels_last)

    def fn1(x, w):
        conv = aten.convolution.default(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        return (aten.relu.default(conv),)

    counters.clear()
    check(fn1, torch.randn(2, 4, 8, 8), w1, atol=1e-5, rtol=1e-5)
    assert "extern_copies" not in counters.snapshot()
