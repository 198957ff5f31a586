# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# ruff: noqa: PLR0124, SIM108  (x != x is the NaN test; constexpr branches stay explicit)
"""Triton device functions that generated kernels call as ``kh.<name>``.

Reduction combiners (NaN-propagating max/min, argmax/argmin with first-index
ties, Welford), integer floor division and remainder with Python semantics,
integer powers, digamma (libdevice has none) and the counter-based random
numbers of ``kiln.loopir.random_bits``, written so that every device computes
the same bits as loopir's reference backend. They take untyped Triton tensors,
hence the mypy exemption above.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def maximum(a, b):
    """NaN wins, as in ``torch.maximum``."""
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def multiply(a, b):
    return a * b


@triton.jit
def bit_xor(a, b):
    return a ^ b


@triton.jit
def max_last(x):
    """The NaN-propagating max over the last axis of a ``[XBLOCK, RBLOCK]`` block."""
    return tl.reduce(x, 1, maximum)[:, None]


@triton.jit
def min_last(x):
    return tl.reduce(x, 1, minimum)[:, None]


@triton.jit
def prod_last(x):
    return tl.reduce(x, 1, multiply)[:, None]


@triton.jit
def xor_last(x):
    return tl.reduce(x, 1, bit_xor)[:, None]


@triton.jit
def _arg_combine(v1, i1, v2, i2, is_max: tl.constexpr):
    n1 = v1 != v1
    n2 = v2 != v2
    if is_max:
        better = (v1 > v2) | (n1 & ~n2)
    else:
        better = (v1 < v2) | (n1 & ~n2)
    same = (v1 == v2) | (n1 & n2)
    pick1 = better | (same & (i1 < i2))
    return tl.where(pick1, v1, v2), tl.where(pick1, i1, i2)


@triton.jit
def argmax_combine(v1, i1, v2, i2):
    return _arg_combine(v1, i1, v2, i2, True)


@triton.jit
def argmin_combine(v1, i1, v2, i2):
    return _arg_combine(v1, i1, v2, i2, False)


@triton.jit
def argmax_last(v, i):
    _, idx = tl.reduce((v, i), 1, argmax_combine)
    return idx[:, None]


@triton.jit
def argmin_last(v, i):
    _, idx = tl.reduce((v, i), 1, argmin_combine)
    return idx[:, None]


@triton.jit
def welford_update(mean, m2, weight, value):
    """Fold one value per lane into running (mean, m2, weight) accumulators."""
    weight = weight + 1.0
    delta = value - mean
    mean = mean + delta / weight
    m2 = m2 + delta * (value - mean)
    return mean, m2, weight


@triton.jit
def welford_combine(mean1, m2_1, w1, mean2, m2_2, w2):
    w = w1 + w2
    delta = mean2 - mean1
    frac = tl.where(w == 0.0, 0.0, w2 / w)
    return mean1 + delta * frac, m2_1 + m2_2 + delta * delta * w1 * frac, w


@triton.jit
def welford_last(mean, m2, weight):
    mean, m2, weight = tl.reduce((mean, m2, weight), 1, welford_combine)
    return mean[:, None], m2[:, None], weight[:, None]


@triton.jit
def int_floordiv(a, b):
    """Floor division of integers (Triton's ``//`` truncates toward zero)."""
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def int_remainder(a, b):
    """``torch.remainder`` on integers: the result takes the divisor's sign."""
    r = a - (a // b) * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def int_fmod(a, b):
    return a - (a // b) * b


@triton.jit
def int_pow(base, exp):
    """``base ** exp`` for integer tensors by squaring (exp >= 0)."""
    result = tl.full(base.shape, 1, base.dtype) + base * 0
    for _ in tl.static_range(63):
        result = tl.where((exp & 1) != 0, result * base, result)
        base = base * base
        exp = exp >> 1
    return result


@triton.jit
def digamma(x):
    """psi(x): reflection below 0, recurrence up to 6, then the asymptotic series."""
    pi = 3.141592653589793
    reflect = x < 0.0
    y = tl.where(reflect, 1.0 - x, x)
    acc = y * 0.0
    for _ in tl.static_range(6):
        small = y < 6.0
        acc = tl.where(small, acc - 1.0 / y, acc)
        y = tl.where(small, y + 1.0, y)
    inv = 1.0 / y
    inv2 = inv * inv
    series = inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240))))
    result = acc + tl.log(y) - 0.5 * inv - series
    result = tl.where(reflect, result - pi / (tl.sin(pi * x) / tl.cos(pi * x)), result)
    is_pole = (x <= 0.0) & (x == tl.floor(x))
    return tl.where(is_pole, float("nan"), result)


@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


@triton.jit
def hash32(seed, offset, stream: tl.constexpr):
    """``kiln_hash32`` of ``kiln.loopir.random_bits`` in int64 arithmetic."""
    seed = seed.to(tl.int64)
    key = _fmix32((seed & 0xFFFFFFFF) ^ ((seed >> 32) & 0xFFFFFFFF))
    return _fmix32((key + 2 * (offset.to(tl.int64) & 0xFFFFFFFF) + stream) & 0xFFFFFFFF)


@triton.jit
def rand(seed, offset):
    return (hash32(seed, offset, 0) >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def randn(seed, offset):
    u1 = ((hash32(seed, offset, 0) >> 8) + 1).to(tl.float32) * 5.9604644775390625e-08
    u2 = (hash32(seed, offset, 1) >> 8).to(tl.float32) * 5.9604644775390625e-08
    return tl.sqrt(-2.0 * tl.log(u1)) * tl.cos(6.283185307179586 * u2)
