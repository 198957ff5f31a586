"""The kernel writer's structure: CSE, store forwarding, dropped stores, 64-bit indexing."""

import sympy
import torch
from triton_corpus import Case, group, inp, pointwise, random_tensor, reduction, run_case

from kiln.codegen_triton import TritonBackend, TritonOptions
from kiln.codegen_triton.kernel import TritonKernel
from kiln.loopir.kernel import KernelGroup
from kiln.loopir.virtualized import ops

F32 = torch.float32


def _src(g: KernelGroup, **kw) -> str:
    return TritonKernel(g, **kw).generate().source


def test_equal_expressions_are_computed_once():
    x = inp("x", F32, [64])
    load = x.make_loader()
    out = pointwise("buf0", F32, [64], lambda i: ops.add(ops.exp(load(i)), ops.exp(load(i))))
    src = _src(group("k", [x], [(out, "x")], 64))
    assert src.count("tl.exp(") == 1 and src.count("tl.load(") == 1


def test_internal_buffers_forward_and_skip_their_store():
    x = inp("x", F32, [64])
    load = x.make_loader()
    mid = pointwise("buf0", F32, [64], lambda i: ops.sin(load(i)))
    lmid = mid.make_loader()
    out = pointwise("buf1", F32, [64], lambda i: ops.cos(lmid(i)))
    g = group("k", [x], [(mid, "x"), (out, "x")], 64)
    g = KernelGroup(
        g.name,
        g.device,
        g.numel,
        g.rnumel,
        g.nodes,
        g.buffers,
        g.inputs,
        g.outputs,
        frozenset({"buf0"}),
    )
    src = _src(g)
    assert "out_ptr0 +" not in src.split("):", 1)[1]  # buf0 is never stored
    assert src.count("tl.load(") == 1
    run_case(Case("internal", g, lambda: [random_tensor(F32, [64])]))


def test_64_bit_indexing_only_for_huge_buffers():
    small = inp("x", F32, [64])
    out = pointwise("buf0", F32, [64], lambda i: ops.neg(small.make_loader()(i)))
    assert "tl.int64" not in _src(group("k", [small], [(out, "x")], 64))
    n = 2**31 + 8
    big = inp("x", F32, [n])
    out = pointwise("buf0", F32, [n], lambda i: ops.neg(big.make_loader()(i)))
    assert "tl.program_id(0).to(tl.int64)" in _src(group("k", [big], [(out, "x")], n))


def test_looped_welford_and_argmax_match_reference():
    x = inp("x", F32, [5, 300])
    load = x.make_loader()
    mean = reduction(
        "buf0", F32, [5], [300], "welford_reduce", F32, lambda i, r: load([i[0], r[0]]), 0
    )
    m2 = reduction(
        "buf1", F32, [5], [300], "welford_reduce", F32, lambda i, r: load([i[0], r[0]]), 1
    )
    arg = reduction(
        "buf2", torch.int64, [5], [300], "argmin", F32,
        lambda i, r: (load([i[0], r[0]]), ops.index_expr(r[0], torch.int64)),
    )  # fmt: skip
    g = group("k", [x], [(mean, "xr"), (m2, "xr"), (arg, "xr")], 5, 300)
    src = _src(g, persistent_limit=64)
    assert src.count("for roffset") == 1 and "kh.welford_update" in src
    backend = TritonBackend(TritonOptions(persistent_reduction_limit=64))
    run_case(Case("welford", g, lambda: [random_tensor(F32, [5, 300])], 1e-4, 1e-4), backend)


def test_a_later_loop_reading_what_an_earlier_loop_stored_waits_at_a_barrier():
    # y = relu(x) is stored by the first loop (it is an output) and read back by the
    # second, which also needs the row sum: without a barrier other threads' stores
    # of y may not be visible yet (Triton does not promise the same thread per element)
    x = inp("x", F32, [6, 300])
    load = x.make_loader()
    y = pointwise("buf0", F32, [6, 300], lambda i: ops.relu(load(i)))
    ly = y.make_loader()
    s = reduction("buf1", F32, [6], [300], "sum", F32, lambda i, r: ly([i[0], r[0]]))
    ls = s.make_loader()
    z = pointwise("buf2", F32, [6, 300], lambda i: ops.sub(ly(i), ls([i[0]])))
    g = group("k", [x], [(y, "xr"), (s, "xr"), (z, "xr")], 6, 300)
    src = _src(g, persistent_limit=64)
    first, second = src.split("for roffset")[1:]
    assert second.count("tl.load(out_ptr0") == 1
    # one barrier, right before the second loop starts
    assert src.count("tl.debug_barrier()") == 1
    assert first.rstrip().endswith("tl.debug_barrier()")
    backend = TritonBackend(TritonOptions(persistent_reduction_limit=64))
    run_case(Case("reload", g, lambda: [random_tensor(F32, [6, 300])], 1e-4, 1e-4), backend)


def test_a_masked_load_of_one_fixed_element_gets_a_block_pointer():
    # BART's shift_tokens_right: out[:, 0] = start token (one element), the rest shifted;
    # Triton refuses a scalar pointer under a block mask
    start, ids = inp("start", torch.int64, [1]), inp("ids", torch.int64, [2, 8])
    lstart, lids = start.make_loader(), ids.make_loader()

    def fn(i):
        col = ops.index_expr(i[1], torch.int64)
        first = ops.eq(col, ops.constant(0, torch.int64))
        head = ops.masked(first, lambda: lstart([sympy.Integer(0)]), 0)
        return ops.where(first, head, lids(i))

    out = pointwise("buf0", torch.int64, [2, 8], fn)
    g = group("k", [start, ids], [(out, "x")], 16)
    src = _src(g)
    assert "in_ptr0 + tl.full([XBLOCK], 0" in src
    ints = lambda: [torch.tensor([7]), torch.randint(1, 50, (2, 8))]  # noqa: E731
    run_case(Case("scalar_masked", g, ints))
