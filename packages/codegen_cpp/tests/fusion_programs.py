"""Fused kernels that exercise the kernel writer's structure (shared by tests and goldens).

Each builder returns a :class:`kiln.loopir.testing.Case`: reductions of every type,
softmax and layer norm (several ``rindex`` loops), strided inputs and outputs,
masked loads (padding), indirect loads (embedding), accumulating scatters,
random numbers, index expressions and 16-bit floats.
"""

from __future__ import annotations

import dataclasses

import torch

from kiln.loopir.kernel import SEEDS
from kiln.loopir.testing import Case, group, inp, pointwise, random_tensor, reduction, scatter
from kiln.loopir.virtualized import ops

F32 = torch.float32


def reduce_case(rtype: str, dtype: torch.dtype, x: int, r: int, inner: bool = True) -> Case:
    """``rtype`` over the last dim (inner) or the first one (a strided reduction)."""
    shape = [x, r] if inner else [r, x]
    src = inp("x", dtype, shape)
    load = src.make_loader()

    def value(i, ri):
        v = load([i[0], ri[0]] if inner else [ri[0], i[0]])
        return (v, ops.index_expr(ri[0], torch.int64)) if rtype in ("argmax", "argmin") else v

    out_dtype = torch.int64 if rtype in ("argmax", "argmin") else dtype
    if rtype == "welford_reduce":
        bufs = [reduction(f"buf{k}", dtype, [x], [r], rtype, dtype, value, k) for k in range(3)]
    else:
        bufs = [reduction("buf0", out_dtype, [x], [r], rtype, dtype, value)]
    kind = {"xor_sum": "int", "any": "bool", "prod": "unit"}.get(rtype, "normal")
    if dtype == torch.bool:
        kind = "bool"
    g = group(f"red_{rtype}", [src], [(b, "xr") for b in bufs], x, r)
    # Long float sums: the lanes add in another order than eager's cascade.
    rtol = 1e-4 if rtype == "welford_reduce" or r > 1000 else None
    return Case(
        f"{rtype}-{dtype}-{x}x{r}-{'inner' if inner else 'outer'}",
        g,
        lambda: [random_tensor(dtype, shape, kind)],
        atol=1e-3 if rtol else None,
        rtol=rtol,
    )


def softmax_case(n: int = 9, d: int = 53, dtype: torch.dtype = F32) -> Case:
    x = inp("x", dtype, [n, d])
    load = x.make_loader()

    def lx(idx):
        return ops.to_dtype(load(idx), F32) if dtype != F32 else load(idx)

    mx = reduction("buf0", F32, [n], [d], "max", F32, lambda i, r: lx([i[0], r[0]]))
    ml = mx.make_loader()
    sm = reduction(
        "buf1",
        F32,
        [n],
        [d],
        "sum",
        F32,
        lambda i, r: ops.exp(ops.sub(lx([i[0], r[0]]), ml([i[0]]))),
    )
    sl = sm.make_loader()

    def out_fn(i):
        v = ops.truediv(ops.exp(ops.sub(lx(i), ml([i[0]]))), sl([i[0]]))
        return ops.to_dtype(v, dtype) if dtype != F32 else v

    out = pointwise("buf2", dtype, [n, d], out_fn, origin="div")
    g = group("softmax", [x], [(mx, "xr"), (sm, "xr"), (out, "xr")], n, d)
    name = f"softmax-{dtype}" if d == 53 else f"softmax-{dtype}-{n}x{d}"
    return Case(name, g, lambda: [random_tensor(dtype, [n, d])])


def gathered_bias_softmax_case() -> Case:
    """Softmax of ``x + table[idx]`` (Swin's relative position bias): an indirect load that
    differs per lane of the ``rindex`` loop, shared with the later loops through a row array."""
    x, table, idx = inp("x", F32, [6, 49]), inp("table", F32, [20]), inp("idx", torch.int64, [49])
    lx, lt, li = x.make_loader(), table.make_loader(), idx.make_loader()

    def biased(i, r):
        return ops.add(lx([i[0], r[0]]), lt([ops.indirect_indexing(li([r[0]]), 20)]))

    mx = reduction("buf0", F32, [6], [49], "max", F32, biased)
    ml = mx.make_loader()
    sm = reduction(
        "buf1", F32, [6], [49], "sum", F32, lambda i, r: ops.exp(ops.sub(biased(i, r), ml(i)))
    )
    sl = sm.make_loader()
    out = pointwise(
        "buf2",
        F32,
        [6, 49],
        lambda i: ops.truediv(ops.exp(ops.sub(biased([i[0]], [i[1]]), ml([i[0]]))), sl([i[0]])),
        origin="div",
    )
    g = group(
        "gathered_bias_softmax", [x, table, idx], [(mx, "xr"), (sm, "xr"), (out, "xr")], 6, 49
    )
    return Case(
        "gathered_bias_softmax",
        g,
        lambda: [
            random_tensor(F32, [6, 49]),
            random_tensor(F32, [20]),
            torch.randint(-20, 20, (49,)),
        ],
    )


def layer_norm_case(n: int = 6, d: int = 100) -> Case:
    x, w = inp("x", F32, [n, d]), inp("w", F32, [d])
    lx, lw = x.make_loader(), w.make_loader()
    mean = reduction("buf0", F32, [n], [d], "welford_reduce", F32, lambda i, r: lx([i[0], r[0]]), 0)
    m2 = reduction("buf1", F32, [n], [d], "welford_reduce", F32, lambda i, r: lx([i[0], r[0]]), 1)
    lmean, lm2 = mean.make_loader(), m2.make_loader()

    def norm(i):
        var = ops.truediv(lm2([i[0]]), ops.constant(float(d), F32))
        rstd = ops.rsqrt(ops.add(var, ops.constant(1e-5, F32)))
        return ops.mul(ops.mul(ops.sub(lx(i), lmean([i[0]])), rstd), lw([i[1]]))

    out = pointwise("buf2", F32, [n, d], norm, origin="mul")
    g = group("layer_norm", [x, w], [(mean, "xr"), (m2, "xr"), (out, "xr")], n, d)
    return Case("layer_norm", g, lambda: [random_tensor(F32, [n, d]), random_tensor(F32, [d])])


def strided_case() -> Case:
    """A transposed input and a transposed (column-major) output."""
    a = inp("a", F32, [24, 40], stride=[1, 24])
    b = inp("b", F32, [24, 40])
    la, lb = a.make_loader(), b.make_loader()
    out = pointwise(
        "buf0", F32, [24, 40], lambda i: ops.add(ops.tanh(la(i)), lb(i)), stride=[1, 24]
    )
    g = group("strided", [a, b], [(out, "x")], 24 * 40)
    return Case(
        "strided",
        g,
        lambda: [random_tensor(F32, [24, 40], stride=[1, 24]), random_tensor(F32, [24, 40])],
    )


def pad_case() -> Case:
    """constant_pad_nd: a masked load with -1.5 outside the source."""
    x = inp("x", F32, [10, 30])
    load = x.make_loader()

    def fn(i):
        col = ops.index_expr(i[1], torch.int64)
        inside = ops.logical_and(
            ops.ge(col, ops.constant(2, torch.int64)), ops.lt(col, ops.constant(32, torch.int64))
        )
        return ops.masked(inside, lambda: ops.exp(load([i[0], i[1] - 2])), -1.5)

    out = pointwise("buf0", F32, [10, 35], fn, origin="constant_pad_nd")
    return Case("pad", group("pad", [x], [(out, "x")], 350), lambda: [random_tensor(F32, [10, 30])])


def embedding_case() -> Case:
    """An indirect load: rows of a table picked by int64 indices (negative ones wrap)."""
    table, idx = inp("table", F32, [50, 24]), inp("idx", torch.int64, [13])
    lt, li = table.make_loader(), idx.make_loader()

    def fn(i):
        row = ops.indirect_indexing(li([i[0]]), 50)
        return ops.mul(lt([row, i[1]]), ops.constant(2.0, F32))

    out = pointwise("buf0", F32, [13, 24], fn, origin="embedding")
    return Case(
        "embedding",
        group("embedding", [table, idx], [(out, "x")], 13 * 24),
        lambda: [random_tensor(F32, [50, 24]), torch.randint(-50, 50, (13,))],
    )


def scatter_add_case() -> Case:
    """index_put with accumulate=True into a mutated input (atomic adds)."""
    target, src, idx = inp("t", F32, [20]), inp("src", F32, [300]), inp("idx", torch.int64, [300])
    ls, li = src.make_loader(), idx.make_loader()

    def out_index(i):
        return [ops.indirect_indexing(li(i), 20)]

    mut = scatter("buf0", target, [300], lambda i: ls(i), out_index, "atomic_add")
    g = group("scatter_add", [target, src, idx], [(mut, "x")], 300)
    return Case(
        "scatter_add",
        g,
        lambda: [random_tensor(F32, [300]), torch.randint(0, 20, (300,)), random_tensor(F32, [20])],
        atol=1e-4,
        rtol=1e-4,
    )


def inplace_case() -> Case:
    """A buffer read and written by one kernel (passed as input and as output)."""
    x = inp("x", F32, [50])
    lx = x.make_loader()
    mut = scatter("buf0", x, [50], lambda i: ops.mul(lx(i), ops.sigmoid(lx(i))), lambda i: i, None)
    g = group("inplace", [x], [(mut, "x")], 50)
    g = dataclasses.replace(g, inputs=("x",))
    return Case("inplace", g, lambda: [random_tensor(F32, [50])])


def bias_rows_case() -> Case:
    """Rows of 100 (not a multiple of the lanes): a column bias and a row scale."""
    x, bias, scale = inp("x", F32, [7, 100]), inp("bias", F32, [100]), inp("scale", F32, [7])
    lx, lb, ls = x.make_loader(), bias.make_loader(), scale.make_loader()
    out = pointwise(
        "buf0",
        F32,
        [7, 100],
        lambda i: ops.mul(ops.add(lx(i), lb([i[1]])), ls([i[0]])),
        origin="add",
    )
    g = group("bias_rows", [x, bias, scale], [(out, "x")], 700)
    return Case(
        "bias_rows",
        g,
        lambda: [random_tensor(F32, [7, 100]), random_tensor(F32, [100]), random_tensor(F32, [7])],
    )


def channel_rows_case(hw: int) -> Case:
    """Batch norm of (2, 20, hw) inputs: per-channel values over rows of ``hw`` pixels."""
    shape = [2, 20, hw]
    x, mean, var = inp("x", F32, shape), inp("mean", F32, [20]), inp("var", F32, [20])
    lx, lm, lv = x.make_loader(), mean.make_loader(), var.make_loader()

    def fn(i):
        scale = ops.rsqrt(ops.add(lv([i[1]]), ops.constant(1e-5, F32)))
        return ops.mul(ops.sub(lx(i), lm([i[1]])), scale)

    out = pointwise("buf0", F32, shape, fn, origin="batch_norm")
    g = group(f"channel_rows_{hw}", [x, mean, var], [(out, "x")], 40 * hw)
    return Case(
        f"channel_rows_{hw}",
        g,
        lambda: [
            random_tensor(F32, shape),
            random_tensor(F32, [20]),
            random_tensor(F32, [20]).abs(),
        ],
    )


def channels_last_case(c: int) -> Case:
    """Batch norm of (2, 37, c) inputs, channels innermost (NHWC): per-channel loads at
    ``xindex % c``, read from a table of one channel row where ``c`` is no whole vectors."""
    shape = [2, 37, c]
    x, mean, var = inp("x", F32, shape), inp("mean", F32, [c]), inp("var", F32, [c])
    lx, lm, lv = x.make_loader(), mean.make_loader(), var.make_loader()

    def fn(i):
        scale = ops.rsqrt(ops.add(lv([i[2]]), ops.constant(1e-5, F32)))
        return ops.mul(ops.sub(lx(i), lm([i[2]])), scale)

    out = pointwise("buf0", F32, shape, fn, origin="batch_norm")
    g = group(f"channels_last_{c}", [x, mean, var], [(out, "x")], 74 * c)
    return Case(
        f"channels_last_{c}",
        g,
        lambda: [
            random_tensor(F32, shape),
            random_tensor(F32, [c]),
            random_tensor(F32, [c]).abs(),
        ],
    )


def random_case() -> Case:
    """rand/randn from a seeds buffer, offsets from the flat index."""
    seeds = inp(SEEDS, torch.int64, [2])

    def fn(i):
        off = ops.index_expr(i[0], torch.int64)
        u = ops.rand(ops.load_seed(SEEDS, 0), off)
        n = ops.randn(ops.load_seed(SEEDS, 1), off)
        return ops.add(u, n)

    out = pointwise("buf0", F32, [1000], fn, origin="rand")
    return Case(
        "random",
        group("random", [seeds], [(out, "x")], 1000),
        lambda: [torch.randint(0, 2**31, (2,))],
        atol=1e-5,
        rtol=1e-5,
    )


def arange_where_case() -> Case:
    """index_expr as data, comparisons, where and a bool output."""
    x = inp("x", F32, [8, 21])
    load = x.make_loader()

    def fn(i):
        pos = ops.to_dtype(ops.index_expr(i[0] * 21 + i[1], torch.int64), F32)
        return ops.where(ops.gt(load(i), ops.constant(0.0, F32)), pos, ops.neg(pos))

    out = pointwise("buf0", F32, [8, 21], fn, origin="where")
    flag = pointwise(
        "buf1", torch.bool, [8, 21], lambda i: ops.isnan(ops.log(load(i))), origin="isnan"
    )
    g = group("arange_where", [x], [(out, "x"), (flag, "x")], 168)
    return Case("arange_where", g, lambda: [random_tensor(F32, [8, 21])])


def half_chain_case(dtype: torch.dtype) -> Case:
    """16-bit storage: load, compute in float, round through to_dtype, store."""
    a = inp("a", dtype, [77])
    la = a.make_loader()
    mid = pointwise(
        "buf0",
        dtype,
        [77],
        lambda i: ops.to_dtype(ops.mul(ops.to_dtype(la(i), F32), ops.constant(3.0, F32)), dtype),
    )
    lm = mid.make_loader()
    out = pointwise(
        "buf1",
        F32,
        [77],
        lambda i: ops.add(ops.to_dtype(lm(i), F32), ops.sigmoid(ops.to_dtype(la(i), F32))),
    )
    g = group(f"half_{dtype}".replace(".", "_"), [a], [(mid, "x"), (out, "x")], 77)
    return Case(f"half-{dtype}", g, lambda: [random_tensor(dtype, [77])])


def pointwise_after_reduction_case() -> Case:
    """An ``x`` node after a reduction: the mean, scaled, stored per row."""
    x = inp("x", F32, [33, 18])
    load = x.make_loader()
    s = reduction("buf0", F32, [33], [18], "sum", F32, lambda i, r: load([i[0], r[0]]))
    ls = s.make_loader()
    mean = pointwise(
        "buf1", F32, [33], lambda i: ops.truediv(ls(i), ops.constant(18.0, F32)), origin="div"
    )
    g = group("mean", [x], [(s, "xr"), (mean, "x")], 33, 18)
    return Case("mean", g, lambda: [random_tensor(F32, [33, 18])])


def fusion_cases() -> list[Case]:
    cases = [
        softmax_case(),
        softmax_case(dtype=torch.bfloat16),
        softmax_case(d=64),  # whole vectors: the loops share exp through a row array
        softmax_case(d=64, dtype=torch.bfloat16),
        gathered_bias_softmax_case(),
        layer_norm_case(),
        strided_case(),
        pad_case(),
        embedding_case(),
        scatter_add_case(),
        random_case(),
        arange_where_case(),
        half_chain_case(torch.bfloat16),
        half_chain_case(torch.float16),
        pointwise_after_reduction_case(),
        inplace_case(),
        bias_rows_case(),
        channel_rows_case(49),  # rows of 49: per-channel loads are contiguous in rows only
        channel_rows_case(64),  # every load is, but rsqrt is per channel
        channels_last_case(12),  # per-channel loads from a table of one row (periodic.py)
        channels_last_case(3),  # a row shorter than a vector
    ]
    for rtype in ("sum", "prod", "max", "min", "argmax", "argmin", "welford_reduce"):
        for dtype in (torch.float32, torch.float64):
            cases.append(reduce_case(rtype, dtype, 5, 45))
        cases.append(reduce_case(rtype, torch.float32, 21, 19, inner=False))
    for rtype in ("sum", "argmax", "welford_reduce", "min"):  # 4 vectors of rows + 2 rows
        cases.append(reduce_case(rtype, torch.float32, 130, 7, inner=False))
    cases.append(reduce_case("sum", torch.float32, 1, 5000))
    # cascade summation, rows in parallel and one row split across threads
    cases += [
        reduce_case("sum", torch.float32, 20, 60000),
        reduce_case("sum", torch.float32, 2, 300000),
    ]
    for rtype in ("sum", "argmin", "welford_reduce", "max"):  # split across threads
        cases.append(reduce_case(rtype, torch.float32, 2, 40000))
    for rtype in ("sum", "max", "min", "xor_sum", "argmax"):
        cases.append(reduce_case(rtype, torch.int64, 4, 40))
    cases.append(reduce_case("any", torch.bool, 6, 33))
    return cases
