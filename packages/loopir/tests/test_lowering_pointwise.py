"""Every elementwise lowering against eager, batched: one graph per dtype and layout."""

import pytest
import torch
from loopir_testing import check

from kiln.loopir import BackendTraits, ReferenceBackend, testing

aten = torch.ops.aten

FLOATS = [torch.float32, torch.float16, torch.bfloat16]

# ops defined on all reals, and ops that want an input in (0, 1)
ANY_REAL = ["abs", "neg", "exp", "exp2", "expm1", "sin", "cos", "tan", "atan", "sinh", "cosh",
            "tanh", "asinh", "erf", "erfc", "sigmoid", "relu", "floor", "ceil", "trunc", "round",
            "sign", "square", "reciprocal", "frac"]  # fmt: skip
UNIT = ["log", "log2", "log10", "log1p", "sqrt", "rsqrt", "asin", "acos", "atanh", "erfinv",
        "lgamma", "digamma"]  # fmt: skip
PREDICATES = ["isnan", "isinf", "isfinite", "signbit", "logical_not"]


def layouts(make):
    """Contiguous, transposed, strided-slice and zero-size versions of an input."""
    return {
        "contiguous": make((3, 5)),
        "transposed": make((5, 3)).t(),
        "sliced": make((3, 10))[:, ::2],
        "zero_size": make((0, 4)),
    }


def _unary_graph(names, x, shift=None):
    def fn(x):
        outs = [getattr(aten, n).default(x) for n in names]
        return tuple(outs)

    return fn


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "zero_size"])
def test_float_unary(dtype, layout):
    x = layouts(lambda s: torch.randn(s, dtype=dtype) * 3)[layout]
    u = layouts(lambda s: torch.rand(s, dtype=dtype) * 0.8 + 0.1)[layout]
    ops_any = ANY_REAL + PREDICATES

    def fn(x, u):
        outs = [getattr(aten, n).default(x) for n in ops_any]
        outs += [getattr(aten, n).default(u) for n in UNIT]
        outs.append(aten.acosh.default(aten.add.Scalar(u, 1.0)))
        return tuple(outs)

    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    check(fn, x, u, **tol)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_unary(dtype):
    if dtype == torch.bool:
        x = torch.rand(4, 6) > 0.5
        names = ["logical_not", "bitwise_not"]
    else:
        x = torch.randint(-50, 50, (4, 6), dtype=dtype)
        names = ["abs", "neg", "sign", "bitwise_not", "floor", "ceil", "trunc", "round",
                 "square", "logical_not", "sin", "exp", "sqrt", "sigmoid", "isnan"]  # fmt: skip

    def fn(x):
        return tuple(getattr(aten, n).default(x) for n in names)

    check(fn, x)


def _overload(name, overload, scalar=None):
    op = getattr(getattr(aten, name), overload)
    if scalar is None:
        return lambda a, b: op(a, b)
    return lambda a, b: op(a, scalar)


ARITH = (
    [
        lambda a, b: aten.add.Tensor(a, b),
        lambda a, b: aten.add.Tensor(a, b, alpha=2),
        lambda a, b: aten.sub.Tensor(a, b),
        lambda a, b: aten.sub.Tensor(a, b, alpha=3),
        lambda a, b: aten.mul.Tensor(a, b),
        lambda a, b: aten.maximum.default(a, b),
        lambda a, b: aten.minimum.default(a, b),
        lambda a, b: aten.add.Scalar(a, 2),
        lambda a, b: aten.sub.Scalar(a, 1),
        lambda a, b: aten.mul.Scalar(a, 3),
        lambda a, b: aten.where.self(aten.gt.Tensor(a, b), a, b),
        lambda a, b: aten.where.ScalarOther(aten.gt.Tensor(a, b), a, 0),
        lambda a, b: aten.where.ScalarSelf(aten.lt.Scalar(a, 0), 1, b),
        lambda a, b: aten.clamp.default(a, -1, 1),
        lambda a, b: aten.clamp.default(a, None, 0),
        lambda a, b: aten.clamp.Tensor(a, b, None),
        lambda a, b: aten.clamp_min.default(a, 0),
        lambda a, b: aten.clamp_max.default(a, 0),
        lambda a, b: aten.clamp_min.Tensor(a, b),
        lambda a, b: aten.clamp_max.Tensor(a, b),
        lambda a, b: aten.masked_fill.Scalar(a, aten.gt.Tensor(a, b), 7),
        lambda a, b: aten.copy.default(a, aten.mul.Scalar(a, 2)),
        lambda a, b: aten.clone.default(a),
        lambda a, b: aten.rsub.Scalar(a, 1),
    ]
    + [_overload(n, "Tensor") for n in ["eq", "ne", "lt", "le", "gt", "ge"]]
    + [_overload(n, "Scalar", 0) for n in ["eq", "ne", "lt", "le", "gt", "ge"]]
    + [_overload(n, "default") for n in ["logical_and", "logical_or", "logical_xor"]]
)

FLOAT_ONLY = [
    lambda a, b: aten.div.Tensor(a, b),
    lambda a, b: aten.div.Scalar(a, 4.0),
    lambda a, b: aten.div.Tensor_mode(a, b, rounding_mode="floor"),
    lambda a, b: aten.div.Tensor_mode(a, b, rounding_mode="trunc"),
    lambda a, b: aten.div.Scalar_mode(a, 3.0, rounding_mode="trunc"),
    lambda a, b: aten.true_divide.Tensor(a, b),
    lambda a, b: aten.floor_divide.default(a, b),
    lambda a, b: aten.remainder.Tensor(a, b),
    lambda a, b: aten.remainder.Scalar(a, 1.5),
    lambda a, b: aten.fmod.Tensor(a, b),
    lambda a, b: aten.fmod.Scalar(a, 1.5),
    lambda a, b: aten.pow.Tensor_Scalar(aten.abs.default(a), 2.5),
    lambda a, b: aten.pow.Tensor_Tensor(aten.abs.default(a), b),
    lambda a, b: aten.pow.Tensor_Scalar(a, 2),
    # the exponents computed without a general power, as ATen's kernels do
    lambda a, b: aten.pow.Tensor_Scalar(a, 3.0),
    lambda a, b: aten.pow.Tensor_Scalar(aten.abs.default(a), 0.5),
    lambda a, b: aten.pow.Tensor_Scalar(aten.abs.default(b), -0.5),
    lambda a, b: aten.pow.Tensor_Scalar(b, -1),
    lambda a, b: aten.pow.Tensor_Scalar(b, -2.0),
    lambda a, b: aten.pow.Scalar(2.0, a),
    lambda a, b: aten.atan2.default(a, b),
    lambda a, b: aten.hypot.default(a, b),
    lambda a, b: aten.copysign.Tensor(a, b),
    lambda a, b: aten.lerp.Scalar(a, b, 0.3),
    lambda a, b: aten.hardtanh.default(a, -0.5, 0.5),
    lambda a, b: aten.lerp.Tensor(a, b, aten.sigmoid.default(b)),
]

INT_ONLY = [
    lambda a, b: aten.floor_divide.default(a, b),
    lambda a, b: aten.remainder.Tensor(a, b),
    lambda a, b: aten.fmod.Tensor(a, b),
    lambda a, b: aten.div.Tensor(a, b),
    lambda a, b: aten.div.Tensor_mode(a, b, rounding_mode="trunc"),
    lambda a, b: aten.div.Tensor_mode(a, b, rounding_mode="floor"),
    lambda a, b: aten.bitwise_and.Tensor(a, b),
    lambda a, b: aten.bitwise_or.Tensor(a, b),
    lambda a, b: aten.bitwise_xor.Tensor(a, b),
    lambda a, b: aten.bitwise_and.Scalar(a, 6),
    lambda a, b: aten.bitwise_left_shift.Tensor_Scalar(a, 2),
    lambda a, b: aten.bitwise_right_shift.Tensor_Scalar(a, 1),
    lambda a, b: aten.pow.Tensor_Scalar(a, 2),
]


def _nonzero(t):
    if t.dtype.is_floating_point:
        return torch.where(t.abs() < 0.1, torch.ones_like(t), t)
    return torch.where(t == 0, torch.ones_like(t), t)


def _binary(ops_list):
    def fn(a, b):
        return tuple(f(a, b) for f in ops_list)

    return fn


SHAPES = {
    "same": ((4, 6), (4, 6)),
    "broadcast": ((4, 1), (1, 6)),
    "rank": ((2, 4, 6), (6,)),
    "zero_size": ((0, 3), (1, 3)),
}


def _make(shape, dtype):
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype) * 2
    return torch.randint(-20, 20, shape, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("shapes", list(SHAPES))
def test_binary(dtype, shapes):
    sa, sb = SHAPES[shapes]
    a, b = _make(sa, dtype), _nonzero(_make(sb, dtype))
    extra = FLOAT_ONLY if dtype.is_floating_point else INT_ONLY
    tol = {} if dtype in (torch.float32, torch.int64) else {"atol": 3e-2, "rtol": 3e-2}
    check(_binary(ARITH + extra), a, b, **tol)


def test_binary_non_contiguous_and_mixed_dtypes():
    a = torch.randn(6, 4).t()
    b = torch.randint(-5, 5, (4, 6))
    c = torch.rand(4, 6) > 0.5
    h = torch.randn(4, 6, dtype=torch.float16)

    def fn(a, b, c, h):
        return (
            aten.add.Tensor(a, b),
            aten.mul.Tensor(b, c),
            aten.add.Tensor(a, h),
            aten.mul.Tensor(h, 2.5),
            aten.where.self(c, a, b),
            aten.bitwise_and.Tensor(c, c),
            aten.add.Tensor(b, 1.5),
            aten.div.Tensor(b, 2),
            aten.eq.Tensor(a, b),
            aten.gt.Scalar(b, 0.5),
        )

    check(fn, a, b, c, h)


def test_conversions():
    x = torch.randn(4, 6) * 10

    def fn(x):
        return (
            aten._to_copy.default(x, dtype=torch.int64),
            aten._to_copy.default(x, dtype=torch.float16),
            aten._to_copy.default(x, dtype=torch.bfloat16),
            aten._to_copy.default(x, dtype=torch.bool),
            aten._to_copy.default(aten.gt.Scalar(x, 0), dtype=torch.float32),
            torch.ops.prims.convert_element_type.default(x, torch.int32),
            aten.clone.default(x),
            aten._to_copy.default(
                aten._to_copy.default(x, dtype=torch.float16), dtype=torch.float64
            ),
        )

    check(fn, x)


def test_nan_propagation():
    x = torch.tensor([[1.0, float("nan"), -2.0], [float("inf"), 0.0, -float("inf")]])
    y = torch.tensor([[float("nan"), 1.0, 3.0], [1.0, float("nan"), 2.0]])

    def fn(x, y):
        return (
            aten.maximum.default(x, y),
            aten.minimum.default(x, y),
            aten.isnan.default(x),
            aten.isinf.default(x),
            aten.clamp.default(x, -1.0, 1.0),
        )

    check(fn, x, y)


def test_remaining_overloads():
    a = torch.randint(1, 30, (3, 4))
    f = torch.randn(3, 4)
    m = torch.rand(3, 4) > 0.5

    def fn(a, f, m):
        return (
            aten.bitwise_and.Scalar_Tensor(6, a),
            aten.bitwise_or.Scalar(a, 3),
            aten.bitwise_or.Scalar_Tensor(3, a),
            aten.bitwise_xor.Scalar(a, 5),
            aten.bitwise_xor.Scalar_Tensor(5, a),
            aten.bitwise_left_shift.Tensor(a, aten.remainder.Scalar(a, 4)),
            aten.bitwise_left_shift.Scalar_Tensor(3, aten.remainder.Scalar(a, 4)),
            aten.bitwise_right_shift.Tensor(a, aten.remainder.Scalar(a, 3)),
            aten.bitwise_right_shift.Scalar_Tensor(64, aten.remainder.Scalar(a, 3)),
            aten.copysign.Scalar(f, -1.0),
            aten.floor_divide.Scalar(a, 4),
            aten.floor_divide.Scalar(f, 0.7),
            aten.masked_fill.Tensor(f, m, aten.select.int(aten.select.int(f, 0, 0), 0, 1)),
            aten.nextafter.default(f, aten.neg.default(f)),
            aten.remainder.Scalar_Tensor(7, a),
            aten.true_divide.Scalar(f, 3.0),
            aten.where.Scalar(m, 1.0, 2.0),
            aten.xlogy.Scalar_Other(aten.abs.default(f), 2.0),
            aten.xlogy.Scalar_Self(2.0, aten.abs.default(f)),
            aten.all.dims(m, [0, 1]),
            aten.lift_fresh_copy.default(f),
            aten.lift_fresh.default(f),
            aten.squeeze_copy.default(aten.unsqueeze.default(f, 1)),
            aten.squeeze_copy.dims(aten.unsqueeze.default(f, 0), [0]),
            aten.detach_copy.default(f),
            aten._unsafe_index.Tensor(f, [aten.remainder.Scalar(a, 3)]),
            aten._unsafe_index_put.default(
                f, [aten.remainder.Scalar(a, 3)], aten.unsqueeze.default(f, 2), True
            ),
        )

    check(fn, a, f, m)


class _StoresBroadcasts(ReferenceBackend):
    """The reference backend storing costly broadcast values first, as the C++ backend does."""

    traits = BackendTraits(broadcast_store_ops=2)


def _eval_batch_norm(x, mean, var, weight):
    col = lambda t: torch.ops.aten.view.default(t, [-1, 1, 1])  # noqa: E731
    invstd = torch.ops.aten.rsqrt.default(torch.ops.aten.add.Tensor(var, 1e-5))
    y = torch.ops.aten.mul.Tensor(torch.ops.aten.sub.Tensor(x, col(mean)), col(invstd))
    return (torch.ops.aten.mul.Tensor(y, col(torch.ops.aten.add.Tensor(weight, 1.0))),)


@pytest.mark.parametrize("size, stored", [((2, 8, 16, 16), True), ((1, 8, 4, 4), False)])
def test_a_costly_value_broadcast_over_many_elements_is_stored_first(size, stored):
    """Eval batch norm's ``1 / sqrt(var + eps)`` is computed once per channel, not at every
    pixel, where the backend asks and the image has at least 64 pixels a channel; the
    weight's ``+ 1`` (two ops) stays inlined."""
    x, mean, var, weight = torch.randn(size), torch.randn(8), torch.rand(8) + 0.5, torch.randn(8)
    for backend, expected in [(_StoresBroadcasts(), 2 if stored else 1), (ReferenceBackend(), 1)]:
        compiled = testing.check(
            _eval_batch_norm, x, mean, var, weight, backend=backend, atol=1e-5, rtol=1e-5
        )
        numels = sorted(int(s.group.numel) for s in compiled.steps)
        assert len(numels) == expected
        assert numels[0] == (8 if expected == 2 else x.numel())
