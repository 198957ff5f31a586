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
    assert "kiln: block graph 0 runs without CUDA graphs" in caplog.text
    assert "not a CUDA device" in caplog.text


def test_options_compile_with_the_reference_backend_too():
    x, w = _inputs()
    f = kiln.compile(block, backend="loopir_reference", options={"fusion": False})
    torch.testing.assert_close(f(x, w), block(x, w))


def _mlp(depth: int = 10, width: int = 64) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


@pytest.mark.gpu
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_reduce_overhead_records_cuda_graphs(train):
    model = _mlp().cuda()
    compiled = kiln.compile(model, mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(8, 64, device="cuda", requires_grad=train)
        with torch.set_grad_enabled(train):
            out, want = compiled(x), model(x)
        torch.testing.assert_close(out, want)
        if train:
            (grad,) = torch.autograd.grad(out.sum(), x)
            (want_grad,) = torch.autograd.grad(want.sum(), x)
            torch.testing.assert_close(grad, want_grad)
    assert counters.snapshot()["codegen_triton"]["cudagraphs_recorded"] == (2 if train else 1)
    # an in-place update of a parameter is read by the next replay (the recording reads it in place)
    with torch.no_grad():
        model[0].weight.mul_(2)
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.gpu
def test_a_cpu_random_op_in_a_cuda_graph_reads_seeds_on_the_cpu():
    # BART's layerdrop draws torch.rand([]) on the CPU in a CUDA model: its C++ kernel
    # must get CPU seeds (it read the CUDA seeds tensor and crashed)
    def fn(x):
        p = torch.rand([])
        return x * 2 + 1, p + 1

    x = torch.randn(8, device="cuda")
    out, p = kiln.compile(fn, fullgraph=True)(x)
    torch.testing.assert_close(out, x * 2 + 1)
    assert p.device.type == "cpu" and 1 <= float(p) < 2
    assert counters.snapshot()["kernels"] == {"triton": 1, "cpp": 1}
