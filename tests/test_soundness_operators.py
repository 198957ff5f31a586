"""Operators whose compiled answer must be eager's, end to end with the default backend.

Complex tensors stay with ATen (no generated kernel computes them, and only ATen resolves their
lazy conjugate and negative bits); outputs viewing an input keep the dtype and bits eager gives
them; the inputs themselves are never written. Sign-like ops on NaN, reductions of 0-d tensors
over a dim with keepdim, gradients near a domain edge (no fused multiply-add where ATen rounds
the product) and half-precision batch-norm running statistics are compared over several calls
with fresh inputs.
"""

from __future__ import annotations

import logging
import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _same(got, want, **tol):
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w, **tol)
        return
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert (got.is_conj(), got.is_neg()) == (want.is_conj(), want.is_neg())
    torch.testing.assert_close(got, want, equal_nan=True, **tol)


def agree(fn, make, *, calls=3, **tol):
    """``fn`` compiled, called on fresh inputs ``calls`` times: eager's answer each time, and
    its inputs left as they were."""
    compiled = kiln.compile(fn)
    for _ in range(calls):
        inputs = make()
        before = [t.clone() for t in inputs]
        got = compiled(*inputs)
        for t, b in zip(inputs, before, strict=True):  # the inputs are unchanged
            torch.testing.assert_close(t, b, rtol=0, atol=0, equal_nan=True)
        _same(got, fn(*inputs), **tol)


def _z():
    return (torch.randn(6, dtype=torch.complex64),)


# ---- complex tensors ---------------------------------------------------------------------------

COMPLEX = {
    "abs": lambda z: z.abs(),
    "times_conj": lambda z: z * z.conj(),
    "fft_abs": lambda z: torch.fft.fft(z).abs(),
    "real_of_times_conj": lambda z: (z * z.conj()).real,
    "imag_then_kernel": lambda z: (z * 2).imag * 3 + 1,
    "view_as_real_then_kernel": lambda z: torch.view_as_real(z) * 2,
    "angle_and_exp": lambda z: torch.exp(z).angle() + z.abs(),
    "complex_sum": lambda z: (z * 1j).sum(),
    "conj_physical": lambda z: torch.conj_physical(z) + z,
}


@pytest.mark.parametrize("name", list(COMPLEX))
def test_complex_values(name, caplog):
    with caplog.at_level(logging.WARNING):
        agree(COMPLEX[name], _z)
    assert "reference backend" not in caplog.text


def test_complex_results_of_real_tensors_and_their_gradients():
    def fn(r, t):
        z = torch.polar(r, t) * torch.complex(t, r)
        return z.real.sum() + z.imag.square().sum() + z.abs().sum()

    compiled = kiln.compile(fn)
    for _ in range(3):
        r, t = torch.rand(5) + 0.1, torch.randn(5)
        mine = [r.clone().requires_grad_(), t.clone().requires_grad_()]
        theirs = [r.clone().requires_grad_(), t.clone().requires_grad_()]
        got, want = compiled(*mine), fn(*theirs)
        got.backward()
        want.backward()
        _same(got, want)
        for m, e in zip(mine, theirs, strict=True):
            _same(m.grad, e.grad)


def test_eigen_decomposition():
    agree(lambda a: torch.linalg.eig(a), lambda: (torch.randn(4, 4),), rtol=1e-5, atol=1e-5)
    agree(lambda a: torch.linalg.eigvals(a).abs(), lambda: (torch.randn(4, 4),))


# ---- outputs viewing an input in another dtype or with a lazy bit -------------------------------

INPUT_VIEWS = {
    "view_as_complex": (lambda x: torch.view_as_complex(x), torch.float32),
    "view_as_real": (lambda z: torch.view_as_real(z), torch.complex64),
    "view_dtype": (lambda x: x.view(torch.int32), torch.float32),
    "real": (lambda z: z.real, torch.complex64),
    "imag": (lambda z: z.imag, torch.complex64),
    "conj": (lambda z: z.conj(), torch.complex64),
}


@pytest.mark.parametrize("name", list(INPUT_VIEWS))
def test_outputs_viewing_an_input(name):
    fn, dtype = INPUT_VIEWS[name]
    agree(fn, lambda: (torch.randn(3, 2, dtype=dtype),))


# ---- sign-like ops and NaN ---------------------------------------------------------------------

NAN = [math.nan, -math.nan, 1.0, -2.0, 0.0, -0.0, math.inf, -math.inf, 3.5, -0.5]


def _with_nans(dtype=torch.float32):
    x = torch.tensor(NAN)[torch.randperm(len(NAN))]
    y = torch.tensor(NAN)[torch.randperm(len(NAN))]
    return x.to(dtype), y.to(dtype)


NAN_OPS = {
    "sign": lambda x, y: torch.sign(x),
    "sgn": lambda x, y: torch.sgn(x),
    "sign_times": lambda x, y: torch.sign(x) * y.nan_to_num(),
    "heaviside": torch.heaviside,
    "copysign": torch.copysign,
    "clamp": lambda x, y: torch.clamp(x, -1, 1),
    "clamp_tensor": lambda x, y: torch.clamp(x, y, y + 1),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
    "nan_to_num": lambda x, y: torch.nan_to_num(x, 1.0, 2.0, -3.0),
    "hardtanh": lambda x, y: F.hardtanh(x),
    "relu": lambda x, y: torch.relu(x),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(NAN_OPS))
def test_nan_through_sign_like_ops(name, dtype):
    agree(NAN_OPS[name], lambda: _with_nans(dtype))


# ---- 0-d reductions over a dim --------------------------------------------------------------------

REDUCTIONS = {
    "sum": torch.sum,
    "prod": torch.prod,
    "mean": torch.mean,
    "amax": torch.amax,
    "amin": torch.amin,
    "argmax": torch.argmax,
    "argmin": torch.argmin,
    "any": lambda x, **kw: torch.any(x > 0, **kw),
    "all": lambda x, **kw: torch.all(x > 0, **kw),
    "max": lambda x, **kw: torch.max(x, **kw),
    "nansum": torch.nansum,
    "logsumexp": torch.logsumexp,
    "var": torch.var,
}


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")  # 0-d var: NaN, as eager
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions_of_0d_tensors_after_1d_ones(name, dim, keepdim):
    """Compiled for a vector, then called with 0-d tensors (a second compile): the results are
    0-d, keepdim or not, as in eager."""
    op = REDUCTIONS[name]

    def fn(x):
        return op(x, dim=dim, keepdim=keepdim)

    compiled = kiln.compile(fn)
    for x in (torch.randn(5), torch.tensor(2.5), torch.tensor(-1.5), torch.randn(())):
        _same(compiled(x), fn(x))


# ---- gradients near a domain edge ----------------------------------------------------------------

EDGE = {
    "asin": (torch.asin, lambda: 1 - torch.rand(256) * 1e-4),
    "acos": (torch.acos, lambda: -1 + torch.rand(256) * 1e-4),
    "atanh": (torch.atanh, lambda: (torch.rand(256) * 2 - 1) * 0.99999),
    "acosh": (torch.acosh, lambda: 1 + torch.rand(256) * 1e-4),
    "log1p": (torch.log1p, lambda: -1 + torch.rand(256) * 1e-4),
    "sqrt": (torch.sqrt, lambda: torch.rand(256) * 1e-30),
    "rsqrt": (torch.rsqrt, lambda: torch.rand(256) * 1e-10 + 1e-30),
}


@pytest.mark.parametrize("name", list(EDGE))
def test_gradients_near_a_domain_edge(name):
    """Within float32 rounding of eager's (the default tolerances of ``assert_close``)."""
    op, make = EDGE[name]
    compiled = kiln.compile(op)
    for _ in range(3):
        x = make()
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = compiled(mine), op(theirs)
        got.sum().backward()
        want.sum().backward()
        _same(got, want)
        _same(mine.grad, theirs.grad)


# ---- batch norm running statistics in half precision -------------------------------------------


def _half_ulps(dtype):
    """Two units in the last place of values in [1, 2), relative or absolute."""
    ulps = 2.0**-6 if dtype == torch.bfloat16 else 2.0**-9
    return {"rtol": ulps, "atol": ulps}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_batch_norm_with_update_keeps_running_statistics(dtype):
    """``_batch_norm_with_update`` (what ``F.batch_norm`` becomes in training) writes its
    running statistics as eager does, to within two of their own ulps (eager rounds its
    half-precision arithmetic step by step)."""

    def fn(x, w, b, rm, rv):
        return aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)[0]

    compiled = kiln.compile(fn)
    stats = torch.randn(3).to(dtype), (torch.rand(3) + 0.5).to(dtype)
    mine, theirs = [s.clone() for s in stats], [s.clone() for s in stats]
    w, b = torch.randn(3).to(dtype), torch.randn(3).to(dtype)
    for _ in range(3):
        x = (torch.randn(4, 3, 5) * 2 + 1).to(dtype)
        _same(compiled(x, w, b, *mine), fn(x, w, b, *theirs), **_half_ulps(dtype))
        for m, t in zip(mine, theirs, strict=True):
            _same(m, t, **_half_ulps(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_batch_norm_module_in_training(dtype):
    torch.manual_seed(0)
    mine, theirs = torch.nn.BatchNorm2d(8).to(dtype), torch.nn.BatchNorm2d(8).to(dtype)
    compiled = kiln.compile(mine)
    for _ in range(3):
        x = (torch.randn(4, 8, 5, 5) * 3 + 1).to(dtype)
        _same(compiled(x), theirs(x), **_half_ulps(dtype))
    for name in ("running_mean", "running_var"):
        _same(getattr(mine, name), getattr(theirs, name), **_half_ulps(dtype))
    assert mine.num_batches_tracked.item() == theirs.num_batches_tracked.item() == 3


# ---- inputs carrying lazy bits ---------------------------------------------------------------------

LAZY_INPUTS = {
    "neg_view": lambda: torch._neg_view(torch.randn(6)),
    "imag_of_conj": lambda: torch.randn(6, dtype=torch.complex64).conj().imag,
    "conj": lambda: torch.randn(6, dtype=torch.complex64).conj(),
}


def _lazy_fn(x):
    return x * 2 + x.sum(), x.view(2, 3), x[1:]


@pytest.mark.parametrize("name", list(LAZY_INPUTS))
def test_inputs_with_a_lazy_bit(name):
    """A negative view (or a conjugate) is read through its bit: ATen's kernels run the graph."""
    agree(_lazy_fn, lambda: (LAZY_INPUTS[name](),))


def test_a_negative_view_after_plain_tensors_of_its_layout():
    """The bits are guarded: an entry compiled for plain tensors does not run for a negative
    view (or a conjugate) of the same layout."""
    compiled = kiln.compile(_lazy_fn)
    for make in (
        lambda: torch.randn(6),
        lambda: torch._neg_view(torch.randn(6)),
        lambda: torch.randn(6, dtype=torch.complex64),
        lambda: torch.randn(6, dtype=torch.complex64).conj(),
        lambda: torch.randn(6),
    ):
        x = make()
        _same(compiled(x), _lazy_fn(x))


def test_imag_of_a_conjugate_input():
    agree(lambda z: (z.imag, z.imag * 2), lambda: (torch.randn(6, dtype=torch.complex64).conj(),))


# ---- lazy bits under both AOT backends ----------------------------------------------------------

LAZY_PROGRAMS = {
    "imag": lambda z: z.imag * 2,
    "real": lambda z: z.real.sin(),
    "imag_alias": lambda z: z.imag,
    "view_as_real_of_resolved": lambda z: torch.view_as_real(z.conj().resolve_conj()) * 2,
    "imag_of_conj_inside": lambda z: (z * 1).conj().imag + 1,
    "imag_of_a_conj_view": lambda z: z[1:].conj().imag * 3,
    "resolve_neg": lambda z: z.conj().imag.resolve_neg() + 1,
    "mutated": lambda z: z.mul_(2) * 1,
}
LAZY_MAKERS = {
    "plain": lambda: torch.randn(4, 3, dtype=torch.complex64),
    "conj": lambda: torch.randn(4, 3, dtype=torch.complex64).conj(),
    "conj_of_a_view": lambda: torch.randn(5, 3, dtype=torch.complex64)[1:].conj(),
}


@pytest.mark.filterwarnings("error:kiln")
@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("make", list(LAZY_MAKERS))
@pytest.mark.parametrize("name", list(LAZY_PROGRAMS))
def test_lazy_bits_of_inputs_and_intermediates(backend, make, name):
    """Fakes carry the lazy bits, so ``imag``/``real``/``view_as_real`` trace what they do on
    the real tensors; inputs with a bit are written back through it."""
    fn = LAZY_PROGRAMS[name]
    compiled = kiln.compile(fn, backend=backend)
    for seed in range(3):
        torch.manual_seed(seed)
        mine = LAZY_MAKERS[make]()
        torch.manual_seed(seed)
        theirs = LAZY_MAKERS[make]()
        got, want = compiled(mine), fn(theirs)
        torch.testing.assert_close(got.resolve_neg(), want.resolve_neg())
        if backend == "aot_eager":  # a kernel's result carries no bit
            assert (got.is_conj(), got.is_neg()) == (want.is_conj(), want.is_neg())
        torch.testing.assert_close(mine.resolve_conj(), theirs.resolve_conj(), rtol=0, atol=0)
    assert kiln.counters.snapshot().get("graph_breaks", {}) == {}


@pytest.mark.filterwarnings("error:kiln")
@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_gradients_through_a_conjugate_input(backend):
    def fn(z):
        return z.imag * 2, (z * z.conj()).real + z.real.sin(), z[1:].conj().imag

    compiled = kiln.compile(fn, backend=backend)
    for _ in range(3):
        leaf = torch.randn(4, 3, dtype=torch.complex64, requires_grad=True)
        got, want = compiled(leaf.conj()), fn(leaf.conj())
        _same(got, want)
        weights = [torch.randn(t.shape) for t in want]
        (mine,) = torch.autograd.grad(got, leaf, weights)
        (theirs,) = torch.autograd.grad(want, leaf, weights)
        torch.testing.assert_close(mine, theirs)


# ---- dtypes eager computes few ops for ------------------------------------------------------

RARE_DTYPES = [torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2]
RARE_PROGRAMS = {
    "add": lambda x: x + 1,
    "mul": lambda x: x * 2,
    "clone": lambda x: x.clone(),
    "transposed_copy": lambda x: x.t().contiguous(),
    "strided_copy": lambda x: x[1:, ::2].clone(),
    "cat": lambda x: torch.cat([x, x]),
    "to_float_and_back": lambda x: (x.to(torch.float32) * 2).to(x.dtype),
    "made_inside": lambda x: (x.to(torch.float32).abs() * 3).to(torch.uint16).to(torch.float32),
    "views": lambda x: (x[1:], x.view(-1), x.t()),
    "sum": lambda x: x.sum(0),
    "amax": lambda x: x.amax(1),
    "compare": lambda x: x == x,
    "bitwise": lambda x: x & x,
    "fill": lambda x: torch.full_like(x, 3),
    "copy_into_input": lambda x: x.copy_(x.flip(0)),
}


def _rare(dtype):
    if dtype.is_floating_point:
        return (torch.randn(4, 6) * 4).to(dtype)
    return torch.randint(0, 1000, (4, 6)).to(dtype)


def _bits(t):
    return t.view(torch.uint8) if t.dtype.itemsize == 1 and t.dtype.is_floating_point else t


@pytest.mark.filterwarnings("error:kiln")
@pytest.mark.parametrize("backend", ["kiln", "loopir_reference"])
@pytest.mark.parametrize("dtype", RARE_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(RARE_PROGRAMS))
def test_dtypes_eager_computes_few_ops_for(backend, dtype, name):
    """Each op on such a dtype is the ATen call eager makes: eager's result, or eager's error."""
    fn = RARE_PROGRAMS[name]
    compiled = kiln.compile(fn, backend=backend)
    for seed in range(2):
        torch.manual_seed(seed)
        mine, theirs = _rare(dtype), _rare(dtype)
        theirs.copy_(mine)
        try:
            want = fn(theirs)
        except (RuntimeError, NotImplementedError) as exc:
            with pytest.raises(type(exc)):
                compiled(mine)
            continue
        got = compiled(mine)
        for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want)), strict=True):
            assert (g.dtype, g.shape) == (w.dtype, w.shape)
            assert torch.equal(_bits(g), _bits(w))
        assert torch.equal(_bits(mine), _bits(theirs))


EMPTY_EXTREMES = {
    "max": lambda y: y.max(),
    "min": lambda y: y.min() * 2,
    "max_dim": lambda y: torch.max(y, dim=0).values + 1,
    "min_dim": lambda y: y.min(dim=0),
    "amax": lambda y: y.amax(dim=0),
    "argmax": lambda y: y.argmax(),
    "argmin_dim": lambda y: y.argmin(dim=0),
}


@pytest.mark.parametrize("name", sorted(EMPTY_EXTREMES))
def test_extremes_over_zero_elements_raise_as_eager(name):
    # max and min have no start value: eager raises where a kernel would return -inf or 0.
    fn = EMPTY_EXTREMES[name]
    compiled = kiln.compile(fn)
    for _ in range(2):
        x = torch.randn(4, 3)
        _same(compiled(x), fn(x))
    empty = torch.randn(0, 3)
    with pytest.raises((RuntimeError, IndexError)) as eager_error:
        fn(empty)
    with warnings.catch_warnings():  # a graph that has to run eagerly may say so
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(eager_error.type, match=str(eager_error.value).split("(")[0]):
            compiled(empty)
    # reducing the non-empty dimension of an empty tensor is fine in both
    other = lambda y: y.max(dim=1).values  # noqa: E731
    _same(kiln.compile(other)(empty), other(empty))


def _no_rows() -> torch.Tensor:
    return torch.zeros(0, dtype=torch.long)


ZERO_EXTENT = {
    "index_by_an_empty_index": (lambda v, i: v[i] * 2, (1, 4)),
    "index_select_empty": (lambda v, i: v.index_select(0, i) + 1, (4, 3)),
    "embedding_of_no_ids": (lambda v, i: F.embedding(i, v).sum(0), (4, 3)),
    "sum_over_no_columns": (lambda v, i: v[:, i].sum(1), (3, 5)),
    "mean_over_no_columns": (lambda v, i: v[:, i].mean(1), (3, 5)),
    "cumsum_of_no_rows": (lambda v, i: v[i].cumsum(0), (4,)),
    "nonzero_rows": (lambda v, i: v[(v > 10).nonzero()[:, 0]], (1, 4)),
}


@pytest.mark.parametrize("name", sorted(ZERO_EXTENT))
def test_kernels_over_zero_elements_read_nothing(name):
    # A load hoisted out of a loop that runs zero times read an empty index tensor (a crash).
    fn, shape = ZERO_EXTENT[name]
    compiled = kiln.compile(fn)
    for _ in range(3):
        v = torch.randn(*shape)
        _same(compiled(v, _no_rows()), fn(v, _no_rows()))


EMPTY_RESULTS = {
    "cat_of_empty_pieces": (lambda x: torch.cat([x.t().reshape(-1), x.t().reshape(-1)]), (0, 2)),
    "cat_of_many_empty_pieces": (lambda x: torch.cat([x * i for i in range(40)], 0), (0, 2)),
    "cat_along_a_full_dim": (lambda x: torch.cat([x, x + 1], 1) * 2, (0, 2)),
    "stack_of_empty": (lambda x: torch.stack([x, x]), (0, 2)),
    "pad_of_empty": (lambda x: F.pad(x, (1, 1)), (0, 2)),
    "empty_cat_beside_a_sum": (lambda x: torch.cat([x[:0], x[:0]]).sum() + x.sum(), (3, 2)),
}


@pytest.mark.parametrize("name", sorted(EMPTY_RESULTS))
def test_results_with_no_element_are_allocated(name):
    # A cat split into per-piece copies had no copy to write an empty result: the wrapper
    # returned a buffer it never allocated.
    fn, shape = EMPTY_RESULTS[name]
    compiled = kiln.compile(fn)
    for _ in range(2):
        x = torch.randn(*shape)
        _same(compiled(x), fn(x))


def _unused_matmul(x):
    x.float() @ x.t()  # float @ double: eager raises though the result is unused
    return x + 1


def _unused_linear(x):
    torch.nn.functional.linear(x, torch.ones(2, x.shape[-1]))
    return x * 2


def _unused_bmm(x):
    torch.bmm(x[None], x.float().t()[None])
    return x.sum()


@pytest.mark.parametrize("fn", [_unused_matmul, _unused_linear, _unused_bmm])
def test_mixed_dtype_products_raise_as_eager_even_when_unused(fn):
    compiled = kiln.compile(fn)
    for _ in range(2):
        x = torch.randn(2, 3, dtype=torch.float64)
        with pytest.raises(RuntimeError) as eager_error:
            fn(x)
        with pytest.raises(RuntimeError, match=re.escape(str(eager_error.value))):
            compiled(x)
    same = torch.randn(2, 3, dtype=torch.float32)
    _same(compiled(same), fn(same))
