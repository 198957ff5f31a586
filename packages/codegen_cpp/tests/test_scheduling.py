"""The backend inside loopir's pipeline: registry, batching, errors, logs, eager parity."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.fx

from kiln.capture import artifacts
from kiln.codegen_cpp import CppBackend, CppBuildError
from kiln.codegen_cpp.scheduling import LazyKernel
from kiln.loopir.backend import Backend, BackendTraits, clear_backend_cache, get_backend
from kiln.loopir.ir.buffers import SliceBuffer
from kiln.loopir.pipeline import compile_graph
from kiln.loopir.scheduler.order import KernelStep

aten = torch.ops.aten


def _meta(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _aten_graph(fn, inputs) -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(fn)

    class Fill(torch.fx.Interpreter):
        def run_node(self, n):
            n.meta["val"] = result = super().run_node(n)
            return result

    Fill(gm).run(*[_meta(t) for t in inputs])
    return gm


def softmax_mul(x, w):
    return (aten.mul.Tensor(aten._softmax.default(x, 1, False), w),)


def column_sum_and_var(x):
    return (aten.sum.dim_IntList(x, [0]), aten.var.correction(x, [1], correction=1))


def transposed_gelu(x):
    t = aten.permute.default(x, [1, 0])
    return (aten.gelu.default(aten.add.Tensor(t, 1.0)),)


def bf16_layer(x, w):
    h = aten.mul.Tensor(aten._to_copy.default(x, dtype=torch.float32), w)
    return (aten._to_copy.default(aten.tanh.default(h), dtype=torch.bfloat16),)


def argmax_rows(x):
    return (aten.argmax.default(x, 1), aten.amin.default(x, [1]))


def cat_of_head_views(a, b):
    """Attention's backward: heads (b, h, t, d) back to (b, t, h*d), three pieces side by side."""
    heads = [aten.reshape.default(aten.transpose.int(z, 1, 2), [2, 8, 32]) for z in (a, b, a)]
    return (aten.cat.default(heads, 2),)


def gelu_and_column_sum(a, g):
    """An MLP's backward: GELU recomputed for the weight gradient, its gradient's column sum."""
    grad = aten.gelu_backward.default(g, a)
    return (aten.gelu.default(a), grad, aten.sum.dim_IntList(grad, [0]))


def row_and_column_sums(g, x):
    """LayerNorm's backward on a square matrix: a row sum feeds the input gradient, column
    sums make the affine gradients; one loop order cannot serve both in one kernel."""
    gx = aten.mul.Tensor(g, x)
    dx = aten.sub.Tensor(g, aten.mul.Tensor(x, aten.sum.dim_IntList(gx, [1], True)))
    return (dx, aten.sum.dim_IntList(g, [0]), aten.sum.dim_IntList(gx, [0]))


PROGRAMS = [
    (softmax_mul, lambda: [torch.randn(40, 100), torch.randn(100)], {}),
    (column_sum_and_var, lambda: [torch.randn(37, 70)], {"atol": 1e-4, "rtol": 1e-4}),
    (transposed_gelu, lambda: [torch.randn(30, 50)], {}),
    (bf16_layer, lambda: [torch.randn(9, 33).to(torch.bfloat16), torch.randn(33)], {}),
    (argmax_rows, lambda: [torch.randn(11, 29)], {}),
    (row_and_column_sums, lambda: [torch.randn(64, 64), torch.randn(64, 64)], {}),
    (gelu_and_column_sum, lambda: [torch.randn(64, 96), torch.randn(64, 96)], {}),
    (cat_of_head_views, lambda: [torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)], {}),
]


@pytest.fixture(scope="module")
def compiled():
    backend = CppBackend()
    out = []
    for fn, make, tol in PROGRAMS:
        inputs = make()
        gm = _aten_graph(fn, inputs)
        out.append((fn, make, tol, compile_graph(gm, [_meta(t) for t in inputs], backend=backend)))
    backend.finalize()  # one build for every program of this module
    return out


@pytest.mark.parametrize("index", range(len(PROGRAMS)), ids=[p[0].__name__ for p in PROGRAMS])
def test_pipeline_matches_eager(compiled, index):
    fn, make, tol, graph = compiled[index]
    inputs = make()
    torch.testing.assert_close(graph(*inputs), fn(*inputs), **tol)


def test_cat_stores_each_piece_with_contiguous_vector_loads(compiled):
    """One kernel storing three windows; each piece's head split keeps the other dims' index,
    so no load is computed lane by lane (as one masked loop it was, and 5x slower)."""
    graph = next(g for fn, _, _, g in compiled if fn is cat_of_head_views)
    (kernel,) = [s for s in graph.steps if isinstance(s, KernelStep)]
    source = kernel.code.source
    assert "from_lanes" not in source and "masked" not in source
    assert source.count(".store(") == 3


def test_a_cat_read_by_pointwise_ops_is_never_stored():
    """A dense block's pattern: the concatenated features only feed a batch norm, so storing
    them piece by piece first would be a copy of every feature map for nothing."""
    a, b = torch.randn(2, 3, 4, 4), torch.randn(2, 5, 4, 4)
    gm = _aten_graph(lambda a, b: (aten.relu.default(aten.cat.default([a, b], 1)),), [a, b])
    graph = compile_graph(gm, [_meta(a), _meta(b)], backend=CppBackend())
    torch.testing.assert_close(graph(a, b)[0], torch.relu(torch.cat([a, b], 1)))
    (kernel,) = [s for s in graph.steps if isinstance(s, KernelStep)]
    assert not any(isinstance(n.buffer, SliceBuffer) for n in kernel.group.nodes)


def test_a_pointwise_partner_of_a_column_sum_iterates_like_it(compiled):
    """GELU shares only its input with the column sum: fused in its own row order, every
    load of one side was a per-lane gather (9x slower); reordered, all are contiguous."""
    graph = next(g for fn, _, _, g in compiled if fn is gelu_and_column_sum)
    for step in graph.steps:
        if isinstance(step, KernelStep):
            assert "gather" not in step.code.source and "lane]" not in step.code.source


def test_registry_finds_the_cpu_backend():
    clear_backend_cache()
    assert isinstance(get_backend("cpu"), CppBackend)


def _tiny_group():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from fusion_programs import softmax_case

    return softmax_case(3, 20).group


def test_build_error_surfaces_at_finalize_and_names_the_file():
    backend = CppBackend()
    code = backend.codegen_kernel(_tiny_group())
    assert isinstance(code.fn, LazyKernel) and code.language == "cpp"
    code.fn.source = code.fn.source.replace("for (", "for ((", 1)  # break the C++
    with pytest.raises(CppBuildError, match=r"\.cpp") as info:
        backend.finalize()
    assert "error" in info.value.compiler_output
    assert info.value.source_path.exists()


def test_generated_code_is_logged_and_dumped(tmp_path, caplog):
    artifacts.set_debug_dir(tmp_path)
    try:
        with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code"):
            with artifacts.frame("cpp_test"):
                code = CppBackend().codegen_kernel(_tiny_group())
    finally:
        artifacts.set_debug_dir(None)
    assert any("fuses max, sum, div" in r.getMessage() for r in caplog.records)
    dumped = list(tmp_path.rglob("*.cpp"))
    assert dumped and 'extern "C"' in dumped[0].read_text()
    assert code.source in dumped[0].read_text()


def test_unsupported_dtype_falls_back_to_the_reference_backend(caplog):
    from kiln.loopir.testing import group, inp, pointwise
    from kiln.loopir.virtualized import ops

    x = inp("x", torch.complex64, [5])
    load = x.make_loader()
    out = pointwise("buf0", torch.complex64, [5], lambda i: ops.mul(load(i), load(i)))
    g = group("complex_square", [x], [(out, "x")], 5)
    with caplog.at_level(logging.WARNING):
        code = CppBackend().codegen_kernel(g)
    assert code.language != "cpp"
    assert any("reference backend" in r.getMessage() for r in caplog.records)
    a = torch.randn(5, dtype=torch.complex64)
    result = torch.empty_like(a)
    code.fn(a, result)
    torch.testing.assert_close(result, a * a)


def test_build_failing_at_first_call_runs_the_reference_backend():
    backend = CppBackend()
    group = _tiny_group()
    code = backend.codegen_kernel(group)
    code.fn.source = code.fn.source.replace("for (", "for ((", 1)  # break the C++
    x = torch.randn(3, 20)
    outs = [torch.empty(3), torch.empty(3), torch.empty(3, 20)]
    with pytest.warns(RuntimeWarning, match="reference backend"):
        code.fn(x, *outs)
    torch.testing.assert_close(outs[2], torch.softmax(x, 1))


def test_no_compiler_means_backend_unavailable(monkeypatch):
    from kiln.codegen_cpp import build, scheduling
    from kiln.loopir.errors import BackendError

    build.toolchain.cache_clear()
    monkeypatch.setenv("CXX", "kiln-no-such-compiler")
    try:
        with pytest.raises(BackendError, match="no C\\+\\+ compiler"):
            scheduling.make_backend("cpu")
    finally:
        monkeypatch.delenv("CXX")
        build.toolchain.cache_clear()


def test_options_set_threads_and_turn_simd_off():
    """``cpp.threads``/``cpp.simd`` reach the kernels of the graph compiled with them."""
    x, w = torch.randn(40, 100), torch.randn(100)
    gm = _aten_graph(softmax_mul, [x, w])
    options = {"cpp.threads": 1, "cpp.simd": False}
    graph = compile_graph(gm, [_meta(x), _meta(w)], backend=CppBackend(), options=options)
    kernels = [s.code.fn for s in graph.steps if hasattr(s, "code")]
    assert kernels
    kernels[0].backend.finalize()
    passed: list[int] = []
    for kernel in kernels:
        assert kernel.backend.threads == 1 and kernel.backend.simd is False
        assert "Vec" not in kernel.source
        real = kernel.function.c_function
        kernel.function.c_function = lambda *a, real=real: (passed.append(a[-1]), real(*a))[1]
    torch.testing.assert_close(graph(x, w)[0], softmax_mul(x, w)[0])
    assert passed == [1] * len(kernels)
    plain = CppBackend()
    assert plain.with_options({"max_autotune": True}) is plain


def test_products_are_rounded_before_they_are_added_as_in_aten():
    """``1 - x * x`` near x = 1 cancels: a fused multiply-add (the compiler's contraction)
    would keep the product's low bits, and asin's gradient would differ from eager's by
    thousands of float32 ulps."""
    aten = torch.ops.aten

    def fn(x):
        return aten.rsqrt.default(aten.add.Tensor(aten.mul.Tensor(aten.neg.default(x), x), 1))

    x = 1 - torch.rand(4096) * 1e-4
    gm = _aten_graph(fn, [x])
    graph = compile_graph(gm, [_meta(x)], backend=CppBackend())
    torch.testing.assert_close(graph(x), fn(x), rtol=0, atol=0)


def test_the_same_kernel_queued_twice_is_defined_once():
    backend = CppBackend()
    first, second = (backend.codegen_kernel(_tiny_group()).fn for _ in range(2))
    assert first.symbol == second.symbol
    backend.finalize()
    x = torch.randn(3, 20)
    for kernel in (first, second):
        outs = [torch.empty(3), torch.empty(3), torch.empty(3, 20)]
        kernel(x, *outs)
        torch.testing.assert_close(outs[2], torch.softmax(x, 1))


def test_each_thread_builds_only_the_kernels_it_queued():
    import threading

    backend = CppBackend()
    queued: list[LazyKernel] = []
    other = threading.Thread(target=lambda: queued.append(backend.codegen_kernel(_tiny_group()).fn))
    other.start()
    other.join()
    mine = backend.codegen_kernel(_tiny_group()).fn
    backend.finalize()  # one definition of the shared symbol: the other thread's is not built
    assert mine.function is not None and queued[0].function is None
    x = torch.randn(3, 20)
    outs = [torch.empty(3), torch.empty(3), torch.empty(3, 20)]
    queued[0](x, *outs)  # its first call builds the queue it waits in, from any thread
    assert queued[0].function is not None
    torch.testing.assert_close(outs[2], torch.softmax(x, 1))


def test_the_backend_is_the_whole_protocol_with_its_traits():
    """Vector lanes compute masked loads too, ATen's max-pool backward scatter beats a
    gather, oneDNN's depthwise convolutions beat a window loop, and a square root at every
    pixel costs more than a pass over the channels: these choices reach lowering through the
    traits, the rest stay at their defaults."""
    backend = CppBackend()
    assert isinstance(backend, Backend)
    assert backend.traits == BackendTraits(
        pointwise_cat=False,
        extern_ops=frozenset({"max_pool2d_with_indices_backward"}),
        lowered_depthwise=False,
        broadcast_store_ops=2,
    )
    assert backend.with_options({}) is backend


def test_a_padded_pooling_mixer_is_one_kernel_of_masked_vector_loads():
    """poolformer's token mixer ``avg_pool(x, 3, 1, 1, count_include_pad=False) - x``: one
    vectorized kernel whose taps at a row's edge are masked vector loads (no lane-by-lane
    reads) and whose positions and divisors are 32-bit lanes (int64 lanes convert to float
    lane by lane without AVX-512)."""

    def mixer(x):
        pooled = aten.avg_pool2d.default(x, [3, 3], [1, 1], [1, 1], False, False)
        return (aten.sub.Tensor(pooled, x),)

    for _ in range(2):
        x = torch.randn(2, 16, 12, 12)
        graph = compile_graph(_aten_graph(mixer, [x]), [_meta(x)], backend=CppBackend())
        torch.testing.assert_close(graph(x)[0], mixer(x)[0])
    (kernel,) = [s for s in graph.steps if isinstance(s, KernelStep)]
    source = kernel.code.source
    assert source.count("kiln::masked_loadu<float>") == 8
    assert "lane]" not in source and "Vec<int64_t>" not in source
