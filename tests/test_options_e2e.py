"""kiln.compile's backend options and modes reach loopir and the code generators (CPU)."""

from __future__ import annotations

import logging

import pytest
import torch

import kiln
from kiln.capture import counters


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def block(x, w):
    return torch.softmax(x @ w, dim=-1).sin() * 2


def _inputs():
    return torch.randn(16, 64), torch.randn(64, 64)


def _kernels() -> int:
    return sum(kiln.stats().kernels.values())


def test_fusion_off_gives_more_kernels():
    x, w = _inputs()
    fused = kiln.compile(block)
    torch.testing.assert_close(fused(x, w), block(x, w))
    with_fusion = _kernels()
    kiln.reset()
    unfused = kiln.compile(block, options={"fusion": False})
    torch.testing.assert_close(unfused(x, w), block(x, w))
    assert _kernels() > with_fusion


def test_simd_off_emits_scalar_cpp():
    x, w = _inputs()
    torch.testing.assert_close(kiln.compile(block)(x, w), block(x, w))
    assert counters.snapshot()["codegen_cpp"].get("vectorized", 0) > 0
    kiln.reset()
    f = kiln.compile(block, options={"cpp.simd": False, "cpp.threads": 1})
    torch.testing.assert_close(f(x, w), block(x, w))
    cpp = counters.snapshot()["codegen_cpp"]
    assert cpp.get("vectorized", 0) == 0 and cpp["scalar"] > 0


def test_reduce_overhead_on_cpu_runs_normally_and_says_why(caplog):
    x, w = _inputs()
    f = kiln.compile(block, mode="reduce-overhead")
    with caplog.at_level(logging.INFO, logger="kiln.codegen_triton.cudagraphs"):
        torch.testing.assert_close(f(x, w), block(x, w))
    assert "not using CUDA graphs" in caplog.text and "not a CUDA device" in caplog.text


def test_options_compile_with_the_reference_backend_too():
    x, w = _inputs()
    f = kiln.compile(block, backend="loopir_reference", options={"fusion": False})
    torch.testing.assert_close(f(x, w), block(x, w))
