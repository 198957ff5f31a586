"""End-to-end structure tests: how many kernels programs become, and why."""

import logging

import torch
from loopir_testing import check

from kiln.capture import counters
from kiln.loopir.pipeline import KernelStep

aten = torch.ops.aten


def test_sin_cos_is_one_kernel():
    c = check(lambda x: (aten.cos.default(aten.sin.default(x)),), torch.randn(8, 16))
    assert c.kernel_count == 1


def test_add_sum_is_one_kernel():
    def fn(a, b):
        return (aten.sum.dim_IntList(aten.add.Tensor(a, b), [1]),)

    c = check(fn, torch.randn(4, 8), torch.randn(4, 8))
    assert c.kernel_count == 1


def test_softmax_last_dim_is_one_kernel():
    c = check(lambda x: (aten._softmax.default(x, -1, False),), torch.randn(4, 8))
    assert c.kernel_count == 1


def test_layer_norm_is_one_kernel():
    def fn(x, w, b):
        return aten.native_layer_norm.default(x, [8], w, b, 1e-5)

    c = check(fn, torch.randn(4, 8), torch.randn(8), torch.randn(8), atol=1e-5, rtol=1e-5)
    assert c.kernel_count == 1


def test_sum0_and_sum1_give_a_logged_reason(caplog):
    def fn(x):
        return (aten.sum.dim_IntList(x, [0]), aten.sum.dim_IntList(x, [1]))

    with caplog.at_level(logging.INFO, logger="kiln.loopir.fusion"):
        c = check(fn, torch.randn(4, 8))
    assert c.kernel_count in (1, 2)
    if c.kernel_count == 2:
        assert "reductions over different iteration spaces" in caplog.text


def test_reversed_read_is_not_fused(caplog):
    def fn(x):
        big = x
        for op in ["sin", "cos", "exp", "tanh", "sigmoid", "abs", "sqrt", "neg", "exp", "cos"]:
            big = getattr(aten, op).default(big)  # costly enough to realize for 3 users
        flipped = aten.add.Tensor(aten.flip.default(big, [0]), 1.0)
        return (big, flipped, aten.mul.Tensor(big, 3.0), aten.sub.Tensor(big, 1.0))

    with caplog.at_level(logging.INFO, logger="kiln.loopir.fusion"):
        c = check(fn, torch.randn(6, 5))
    assert c.kernel_count == 2
    assert "reads buf0 at" in caplog.text


def test_reduction_over_leading_dim_fuses_with_reordered_pointwise():
    def fn(x):
        s = aten.sum.dim_IntList(x, [0], True)  # reduce over rows, broadcast back
        return (aten.sub.Tensor(x, s),)

    c = check(fn, torch.randn(6, 5))
    assert c.kernel_count == 1  # x - s iterates (column, row), like the reduction
    (step,) = c.steps
    assert step.group.nodes[1].loop_order() == (1, 0)


def test_batch_norm_training_is_one_kernel():
    x, w, b = torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5

    def fn(x, w, b, rm, rv):
        out = aten._native_batch_norm_legit_functional.default(x, w, b, rm, rv, True, 0.1, 1e-5)
        return (aten.relu.default(out[0]),)

    c = check(fn, x, w, b, rm, rv, atol=1e-5, rtol=1e-5)
    assert c.kernel_count == 1


def test_one_element_kernels_are_one_launch():
    """BatchNorm's ``num_batches_tracked + 1``, one per layer in training: independent
    one-element kernels share no buffer, yet run as one kernel."""
    counts = [torch.tensor(n) for n in range(4)]

    def fn(a, b, c, d):
        return tuple(aten.add.Tensor(n, 1) for n in (a, b, c, d))

    c = check(fn, *counts)
    assert c.kernel_count == 1


def test_extern_matmul_with_fused_epilogue():
    x, w, b = torch.randn(4, 6), torch.randn(5, 6), torch.randn(5)
    bx, by = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    img, k = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)

    def fn(x, w, b, bx, by, img, k):
        lin = aten.addmm.default(b, x, aten.t.default(w))
        mm = aten.mm.default(x, aten.permute.default(w, [1, 0]))
        conv = aten.convolution.default(img, k, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return (
            aten.relu.default(lin),
            aten.mul.Tensor(aten.sigmoid.default(mm), 2.0),
            aten.bmm.default(bx, by),
            aten.gelu.default(conv),
        )

    c = check(fn, x, w, b, bx, by, img, k, atol=1e-5, rtol=1e-5)
    assert "extern" in c.source
    kernels = [s for s in c.steps if isinstance(s, KernelStep)]
    assert all(len(s.group.nodes) >= 1 for s in kernels)


def test_fallback_is_counted():
    counters.clear()

    def fn(x):
        v = aten.cummax.default(x, 1)
        return (aten.add.Tensor(v[0], 1.0), v[1])

    c = check(fn, torch.randn(3, 5))
    assert counters.snapshot()["fallback_ops"]["aten.cummax.default"] == 1
    assert "fallback" in c.source


def test_memory_is_freed_and_reused():
    def fn(x):
        a = aten.sum.dim_IntList(aten.exp.default(x), [1], True)
        b = aten.sum.dim_IntList(aten.add.Tensor(x, a), [1], True)
        c = aten.sum.dim_IntList(aten.mul.Tensor(x, b), [1], True)
        return (aten.add.Tensor(c, 1.0),)

    # c sums 32 products with b (about 1e3), so c reaches 1e4, where an ulp is 1e-3: summed in
    # another order (a code generator's vector lanes), c moves by up to about 2e-2
    c = check(fn, torch.randn(64, 32), rtol=1e-4, atol=5e-2)
    assert "del " in c.source
    assert c.peak_bytes > 0


def test_output_keeps_input_strides_for_pointwise():
    x = torch.randn(5, 4).t()
    c = check(lambda x: (aten.mul.Tensor(x, 2.0),), x)
    assert c(x)[0].stride() == (x * 2).stride()


def test_graph_with_scalar_and_none_outputs():
    def fn(x):
        return (aten.add.Tensor(x, 1.0), None)

    check(fn, torch.randn(3))


def test_pointwise_kernel_walks_memory_in_the_output_order():
    from kiln.loopir.printing import render_group

    x = torch.randn(5, 4).t()
    c = check(lambda x: (aten.mul.Tensor(x, 2.0),), x)
    (step,) = c.steps
    assert step.group.nodes[0].loop_order() == (1, 0)
    assert "store(buf0, xindex," in render_group(step.group)
    assert "load(x, xindex)" in render_group(step.group)


def test_dying_input_is_overwritten_in_place():
    def fn(x):
        a = aten.sum.dim_IntList(x, [1], True)  # a reduction: its own buffer
        b = aten.exp.default(aten.sub.Tensor(x, a))
        return (aten.mul.Tensor(aten.sum.dim_IntList(b, [0]), 2.0),)

    c = check(fn, torch.randn(8, 8))
    assert "# inplace" in c.source or "# reuse" in c.source or c.kernel_count <= 2


def test_fusion_off_gives_one_kernel_per_buffer_and_kernels_are_counted():
    from loopir_testing import aten_graph, to_meta

    from kiln.loopir import ReferenceBackend, compile_graph

    counters.clear()
    x = torch.randn(4, 8)
    gm = aten_graph(lambda x: (aten._softmax.default(x, -1, False),), x)
    c = compile_graph(gm, [to_meta(x)], backend=ReferenceBackend(), fusion=False)
    torch.testing.assert_close(c(x)[0], torch.softmax(x, -1))
    assert c.kernel_count == 3
    assert counters.snapshot()["kernels"] == {"reference": 3}


def test_buffer_viewed_by_a_fallback_result_lives_as_long_as_the_view():
    def fn(x):
        base = aten.exp.default(x)  # a computed buffer...
        window = aten.unfold.default(base, 0, 2, 1)  # ...viewed by a fallback call
        other = aten.mul.Tensor(aten.cos.default(x), 3.0)  # same size: could reuse base
        return (aten.add.Tensor(aten.sum.dim_IntList(window, [2]), 1.0), other)

    check(fn, torch.randn(6, 3))


def test_storage_given_away_in_place_is_not_reused_while_its_new_owner_lives():
    def fn(x, w):
        a = aten.mm.default(x, w)  # extern result
        z = aten.relu.default(a)  # overwrites a in place: a dies here, z owns the storage
        b = aten.mm.default(z, w)
        c = aten.add.Tensor(aten.sigmoid.default(b), z)  # same layout as a: must not take it
        return (aten.mul.Tensor(c, z),)

    c = check(fn, torch.randn(8, 8), torch.randn(8, 8))
    assert "# inplace" in c.source


def test_ir_logs_name_their_passes(caplog):
    with caplog.at_level(logging.INFO, logger="kiln.loopir.ir"):
        check(lambda x: (aten.sum.dim_IntList(aten.mm.default(x, x), [1]),), torch.randn(4, 4))
    assert "# loopir IR after pass 'lower'" in caplog.text
    assert "# loopir kernels after pass 'schedule'" in caplog.text
    assert "Extern aten.mm.default" in caplog.text


def test_a_sum_of_many_buffers_read_twice_is_stored_once():
    """A residual stream: each reader of ``a + b + c + d + e`` inlined would load all five
    inputs again; the sum is stored once instead and the second reduction reads only it."""

    def fn(a, b, c, d, e):
        h = aten.add.Tensor(aten.add.Tensor(aten.add.Tensor(aten.add.Tensor(a, b), c), d), e)
        return (aten.sum.dim_IntList(h, [0]), aten.amax.default(h, [1]))

    inputs = [torch.randn(6, 40) for _ in range(5)]
    c = check(fn, *inputs, atol=1e-5, rtol=1e-5)
    kernels = [s for s in c.steps if isinstance(s, KernelStep)]
    reads_of_inputs = [len(s.reads & set("abcde")) for s in kernels]
    assert sorted(reads_of_inputs) == [0] * (len(kernels) - 1) + [5], reads_of_inputs


def test_a_view_that_is_its_whole_buffer_is_the_buffer():
    # t(t(.)) lowers to a view with the buffer's own sizes and strides: as an extern argument or
    # an output it is the buffer itself (no as_strided per call), unless it is an input
    # returned, or a dimension of size 1 (whose stride an extern result need not match)
    g, x, w, x1 = torch.randn(4, 5), torch.randn(4, 6), torch.randn(5, 6), torch.randn(1, 5)

    def tt(t):
        return aten.t.default(aten.t.default(t))

    def fn(g, x, w, x1):
        dx = aten.mm.default(g, tt(w))
        dw = aten.mm.default(aten.t.default(g), x)
        return (dx, tt(dw), tt(w), tt(aten.mm.default(x1, w)))

    c = check(fn, g, x, w, x1, atol=1e-5, rtol=1e-5)
    returned = c.source.strip().splitlines()[-1]
    assert "as_strided(w, (5, 6), (6, 1))" not in c.source.replace(returned, "")
    assert returned.count("as_strided(") == 2, returned  # the input, and the (1, 6) result
    dx, dw, w_view, row = c(g, x, w, x1)
    assert not dw._is_view() and w_view._is_view() and row._is_view()
