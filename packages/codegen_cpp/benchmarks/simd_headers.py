"""Compile time and speed of one kernel written with at::vec (torch's headers) and kiln_vec.h.

Run: ``.venv/bin/python packages/codegen_cpp/benchmarks/simd_headers.py``. The kernel is
``x*sigmoid(x)*tanh(y) + erf(0.7071x) + log|y|`` over 4M floats; README.md quotes the numbers.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

from kiln.codegen_cpp.build import include_dir

N = 1 << 22
AT_VEC = r"""
#include <ATen/cpu/vec/vec.h>
#include <cmath>
extern "C" void kernel(const float* a0, const float* b0, float* out, int64_t n) {
  using V = at::vec::Vectorized<float>;
  const int64_t step = V::size(), end = n - n % step;
  #pragma omp parallel for
  for (int64_t i = 0; i < end; i += step) {
    V a = V::loadu(a0 + i), b = V::loadu(b0 + i);
    V r = a / (V(1.0f) + (-a).exp()) * b.tanh() + (a * V(0.7071f)).erf() + b.abs().log();
    r.store(out + i);
  }
  for (int64_t i = end; i < n; ++i)
    out[i] = a0[i] / (1 + std::exp(-a0[i])) * std::tanh(b0[i]) + std::erf(a0[i] * 0.7071f)
             + std::log(std::abs(b0[i]));
}
"""
KILN_VEC = r"""
#include "kiln_vec.h"
extern "C" void kernel(const float* a0, const float* b0, float* out, int64_t n) {
  using V = kiln::Vec<float>;
  const int64_t end = n - n % kiln::kLanes;
  #pragma omp parallel for
  for (int64_t i = 0; i < end; i += kiln::kLanes) {
    V a = V::loadu(a0 + i), b = V::loadu(b0 + i);
    V r = a / (V(1.0f) + kiln::exp(-a)) * kiln::tanh(b) + kiln::erf(a * V(0.7071f))
          + kiln::log(kiln::abs(b));
    r.store(out + i);
  }
  for (int64_t i = end; i < n; ++i)
    out[i] = a0[i] / (1 + std::exp(-a0[i])) * std::tanh(b0[i]) + std::erf(a0[i] * 0.7071f)
             + std::log(std::abs(b0[i]));
}
"""
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-w"]


def build(source: str, extra: list[str], folder: Path, name: str) -> tuple[Path, float]:
    src, lib = folder / f"{name}.cpp", folder / f"{name}.so"
    src.write_text(source)
    start = time.perf_counter()
    subprocess.run(["g++", *FLAGS, *extra, str(src), "-o", str(lib)], check=True)
    return lib, time.perf_counter() - start


def run(lib: Path, a: torch.Tensor, b: torch.Tensor) -> tuple[float, torch.Tensor]:
    fn = ctypes.CDLL(str(lib)).kernel
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64]
    out = torch.empty_like(a)
    args = (a.data_ptr(), b.data_ptr(), out.data_ptr(), a.numel())
    fn(*args)
    start = time.perf_counter()
    for _ in range(20):
        fn(*args)
    return (time.perf_counter() - start) / 20, out


def main() -> None:
    # at::vec's exp/log/tanh call Sleef inside libtorch_cpu: make its symbols global.
    torch_lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    ctypes.CDLL(str(torch_lib), mode=ctypes.RTLD_GLOBAL)
    a, b = torch.randn(N), torch.randn(N)
    want = a * torch.sigmoid(a) * torch.tanh(b) + torch.erf(a * 0.7071) + torch.log(b.abs())
    capability = "AVX512" if "AVX512" in torch.backends.cpu.get_cpu_capability() else "AVX2"
    at_flags = [f"-DCPU_CAPABILITY_{capability}", f"-DCPU_CAPABILITY={capability}"]
    at_flags += [f"-I{p}" for p in cpp_extension.include_paths()]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, source, extra in (
            ("at::vec", AT_VEC, at_flags),
            ("kiln_vec.h", KILN_VEC, [f"-I{include_dir()}"]),
        ):
            lib, compile_s = build(source, extra, folder, name.replace(":", "_").replace(".", "_"))
            seconds, out = run(lib, a, b)
            err = (out - want).abs().nan_to_num(0.0).max().item()
            assert torch.isnan(out).sum() == torch.isnan(want).sum(), "NaN mismatch"
            print(
                f"{name:10s} compile {compile_s:5.2f} s  run {seconds * 1e3:6.2f} ms  max err {err:.1e}"
            )
    print(f"threads {torch.get_num_threads()}, cores {os.cpu_count()}")


if __name__ == "__main__":
    main()
