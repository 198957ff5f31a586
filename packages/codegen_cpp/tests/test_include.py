"""kiln_vec.h / kiln_scalar.h / kiln_reduce.h against torch on hard inputs (one build)."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch

from kiln.codegen_cpp import build

FUNCS = ["exp", "log", "tanh", "sigmoid", "erf", "sin", "cos"]
SOURCE = """
#include "kiln_reduce.h"
extern "C" void vec_unary(const float* in, float* out, int64_t n, int64_t which) {
  using V = kiln::Vec<float>;
  for (int64_t i = 0; i < n; i += kiln::kLanes) {
    V a = V::loadu(in + i), r;
    switch (which) {
      case 0: r = kiln::exp(a); break;
      case 1: r = kiln::log(a); break;
      case 2: r = kiln::tanh(a); break;
      case 3: r = kiln::sigmoid(a); break;
      case 4: r = kiln::erf(a); break;
      case 5: r = kiln::sin(a); break;
      case 6: r = kiln::cos(a); break;
      case 7: r = kiln::sqrt(a); break;
      case 8: r = kiln::floor(a); break;
      case 9: r = kiln::ceil(a); break;
      case 10: r = kiln::trunc(a); break;
      default: r = kiln::nearbyint(a); break;
    }
    r.store(out + i);
  }
}
extern "C" void int_div(const int64_t* a, const int64_t* b, int64_t* q, int64_t* r, int64_t n) {
  for (int64_t i = 0; i < n; ++i) { q[i] = kiln::floordiv(a[i], b[i]); r[i] = kiln::pymod(a[i], b[i]); }
}
extern "C" void to_bf16(const float* in, uint16_t* scalar, uint16_t* vec, int64_t n) {
  for (int64_t i = 0; i < n; ++i) scalar[i] = kiln::float_to_bf16(in[i]);
  for (int64_t i = 0; i + kiln::kLanes <= n; i += kiln::kLanes) kiln::store_bf16(vec + i, kiln::Vec<float>::loadu(in + i));
}
extern "C" void float_div(const double* a, const double* b, double* q, double* r, int64_t n) {
  for (int64_t i = 0; i < n; ++i) { q[i] = kiln::floordiv(a[i], b[i]); r[i] = kiln::pymod(a[i], b[i]); }
}
extern "C" void sign(const double* in, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = kiln::sign(in[i]);
}
extern "C" int64_t lanes() { return kiln::kLanes; }
"""


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    (built,) = build.build_libraries([SOURCE])
    return ctypes.CDLL(str(built.path))


def _hard_inputs() -> torch.Tensor:
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-40, 88.7, 89.0, -87.5,
               -104.0, -150.0, 1e6, 3e4, -3e4, 1e-8, 0.2, 0.9, 4.0, 1e38, 88.72, 88.75, -103.5]  # fmt: skip
    x = torch.cat([torch.tensor(special), torch.randn(4000) * 10, torch.rand(1000) * 1e-3])
    return x[: x.numel() // 64 * 64].contiguous()


EXACT = ["sqrt", "floor", "ceil", "trunc", "round"]


@pytest.mark.parametrize("which", range(len(EXACT)), ids=EXACT)
def test_vector_square_root_and_rounding_equal_torch_bit_for_bit(lib, which):
    halves = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 8388607.5, -8388607.5, 16777217.0, 0.49999997]
    x = torch.cat([_hard_inputs(), torch.tensor(halves * 4 + [0.0] * 24), torch.randn(64) * 4])
    x = x[: x.numel() // 64 * 64].contiguous()
    out = torch.empty_like(x)
    lib.vec_unary(
        ctypes.c_void_p(x.data_ptr()),
        ctypes.c_void_p(out.data_ptr()),
        ctypes.c_int64(x.numel()),
        ctypes.c_int64(len(FUNCS) + which),
    )
    # the square root correctly rounded, as the C library's (torch's own is within an ulp)
    want = x.double().sqrt().float() if which == 0 else getattr(torch, EXACT[which])(x)
    assert torch.equal(out.isnan(), want.isnan())
    same = out.view(torch.int32) == want.view(torch.int32)  # the sign of zeros too
    assert bool((same | want.isnan()).all()), x[~(same | want.isnan())][:8]


@pytest.mark.parametrize("which", range(len(FUNCS)), ids=FUNCS)
def test_vector_math_is_accurate(lib, which):
    x = _hard_inputs()
    out = torch.empty_like(x)
    lib.vec_unary(
        ctypes.c_void_p(x.data_ptr()),
        ctypes.c_void_p(out.data_ptr()),
        ctypes.c_int64(x.numel()),
        ctypes.c_int64(which),
    )
    want = getattr(torch, FUNCS[which])(x.double()).float()
    torch.testing.assert_close(out, want, equal_nan=True, rtol=4e-7, atol=1e-37)


def test_floor_division_and_modulo_follow_python(lib):
    a = torch.randint(-100, 100, (500,))
    b = torch.randint(1, 13, (500,)) * torch.where(torch.rand(500) > 0.5, 1, -1)
    q, r = torch.empty_like(a), torch.empty_like(a)
    lib.int_div(*(ctypes.c_void_p(t.data_ptr()) for t in (a, b, q, r)), ctypes.c_int64(500))
    assert q.tolist() == [x // y for x, y in zip(a.tolist(), b.tolist())]
    assert r.tolist() == [x % y for x, y in zip(a.tolist(), b.tolist())]


def test_float_floor_division_and_remainder_follow_torch(lib):
    a = torch.cat([torch.tensor([1.0, -1.0, 7.5, -7.5, 0.0, 5.0]), torch.randn(200) * 10])
    b = torch.cat([torch.tensor([0.1, 0.1, -2.0, 2.0, -3.0, 0.0]), torch.randn(200)])
    q, r = torch.empty_like(a, dtype=torch.float64), torch.empty_like(a, dtype=torch.float64)
    a, b = a.double(), b.double()
    lib.float_div(*(ctypes.c_void_p(t.data_ptr()) for t in (a, b, q, r)), ctypes.c_int64(a.numel()))
    torch.testing.assert_close(
        q, torch.div(a, b, rounding_mode="floor"), equal_nan=True, rtol=0, atol=0
    )
    torch.testing.assert_close(r[b != 0], torch.remainder(a, b)[b != 0], rtol=0, atol=0)


def test_sign_of_nan_and_zeros_follows_torch(lib):
    x = torch.tensor([math.nan, -math.nan, 0.0, -0.0, math.inf, -math.inf, 2.5, -1e-300])
    out = torch.empty_like(x, dtype=torch.float64)
    x = x.double()
    lib.sign(*(ctypes.c_void_p(t.data_ptr()) for t in (x, out)), ctypes.c_int64(x.numel()))
    assert out.tolist() == torch.sign(x).tolist()  # NaN's sign is 0, as in torch


def test_bfloat16_rounding_matches_torch(lib):
    x = torch.cat(
        [torch.tensor([math.nan, math.inf, -math.inf, 1.00390625, 1.01171875]), torch.randn(1000)]
    )
    x = x[: x.numel() // 16 * 16].contiguous()
    scalar, vec = (
        torch.empty(x.numel(), dtype=torch.int16),
        torch.empty(x.numel(), dtype=torch.int16),
    )
    lib.to_bf16(
        *(ctypes.c_void_p(t.data_ptr()) for t in (x, scalar, vec)), ctypes.c_int64(x.numel())
    )
    want = x.to(torch.bfloat16)
    for got in (scalar, vec):
        torch.testing.assert_close(got.view(torch.bfloat16), want, equal_nan=True, rtol=0, atol=0)


def test_lane_count_matches_the_toolchain(lib):
    lib.lanes.restype = ctypes.c_int64
    assert lib.lanes() == build.toolchain().lanes
