"""``prims`` lowerings (what ``torch._refs`` decompositions emit) against eager."""

import torch
from loopir_testing import check

prims = torch.ops.prims


def test_prims():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    i = torch.randint(-9, 9, (3, 4))
    j = torch.randint(1, 5, (3, 4))

    def fn(x, y, i, j):
        b = prims.broadcast_in_dim.default(prims.sum.default(x, [1]), [3, 4], [0])
        return (
            prims.add.default(x, y),
            prims.mul.default(x, y),
            prims.div.default(x, y),
            prims.div.default(i, j),
            prims.where.default(prims.gt.default(x, y), x, y),
            prims.exp.default(x),
            prims.rsqrt.default(prims.abs.default(x)),
            prims.sum.default(x, [0]),
            prims.sum.default(x, [0, 1]),
            prims.prod.default(x, [1]),
            prims.amax.default(x, [0, 1]),
            prims.amin.default(x, [1]),
            prims.var.default(x, [1], 1.0),
            prims.var.default(x, [0], 0.0),
            b,
            prims.broadcast_in_dim.default(prims.sum.default(x, [0]), [2, 3, 4], [2]),
            prims.squeeze.default(prims.broadcast_in_dim.default(x, [3, 1, 4], [0, 2]), [1]),
            prims.transpose.default(x, [1, 0]),
            prims.collapse_view.default(x, 0, 1),
            prims.split_dim.default(x, 1, 2),
            prims.view_of.default(x),
        )

    check(fn, x, y, i, j, atol=1e-5, rtol=1e-5)


UNARY = ["bitwise_not", "ceil", "cos", "erf", "exp2", "expm1", "floor", "isfinite", "log", "log1p",
         "log2", "neg", "reciprocal", "round", "sign", "sin", "sqrt", "tanh", "trunc"]  # fmt: skip
BINARY = ["atan2", "eq", "fmod", "ge", "le", "lt", "maximum", "minimum", "ne", "pow", "sub"]
BITWISE = ["bitwise_and", "bitwise_or", "bitwise_xor"]


def test_elementwise_prims():
    u = torch.rand(3, 5) + 0.5
    v = torch.rand(3, 5) + 0.5
    i = torch.randint(0, 64, (3, 5))
    j = torch.randint(0, 64, (3, 5))

    def fn(u, v, i, j):
        outs = [getattr(prims, n).default(i if n == "bitwise_not" else u) for n in UNARY]
        outs += [getattr(prims, n).default(u, v) for n in BINARY]
        outs += [getattr(prims, n).default(i, j) for n in BITWISE]
        return tuple(outs)

    check(fn, u, v, i, j, atol=1e-5, rtol=1e-5)
