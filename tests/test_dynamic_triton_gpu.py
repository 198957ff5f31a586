"""Triton kernels over symbolic sizes on a GPU: one compile for every size, equal to eager.

Each program is compiled with ``dynamic=True`` (and ``dynamic_kernels``) on CUDA tensors,
where the default backend generates Triton, and called at several sizes, the first of them
unusual numbers so that a kernel or wrapper that baked a size in shows it as a literal.
``mode="reduce-overhead"`` records one CUDA graph per distinct set of sizes and keeps the
latest ``kiln.codegen_triton.cudagraphs.GRAPHS_KEPT``. Skipped without CUDA.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.capture import counters

pytestmark = pytest.mark.gpu
cudagraphs = pytest.importorskip("kiln.codegen_triton.cudagraphs")

_SIZES = ((37, 53), (5, 19), (53, 37), (64, 128), (37, 53))


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        yield
    kiln.reset()


def _pointwise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 2.0) + (x - y).abs().sqrt() * torch.where(x > 0, x, y)


def _broadcast(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y[0] + x[:, :1] - y.sum(0)


def _reductions(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.sum(1) + x.amax(1) * x.var(1) + x.argmax(1) + x.mean(0).sum()


def _softmaxes(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1) + torch.log_softmax(y * 2, 0)


def _views(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    n, m = x.shape
    flat = x.reshape(-1).sin().view(n, m)
    return flat + torch.cat([x[1:], x[:1]], 0) + y.flip(0) + x[:, 1:].sum(1, keepdim=True)


def _norm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Rows of a static 24 over a symbolic count of them (persistent reductions)."""
    row = torch.arange(24, device=x.device) * 0.1
    return F.layer_norm(x[:, :1] * row + y[:, 1:2], (24,)) * 2


PROGRAMS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "pointwise": _pointwise,
    "broadcast": _broadcast,
    "reductions": _reductions,
    "softmaxes": _softmaxes,
    "views": _views,
    "layer_norm_static_rows": _norm,
}


def _check_once(stats: dict[str, int], why: str = "") -> None:
    assert stats["graphs_compiled"] == 1
    assert not stats.get("static_shape_fallbacks"), why
    assert not stats.get("size_specializations")
    assert not stats.get("eager_fallbacks")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_one_compile_for_every_size(name: str, caplog: pytest.LogCaptureFixture) -> None:
    fn = PROGRAMS[name]
    compiled = kiln.compile(fn, dynamic=True, options={"dynamic_kernels": True})
    caplog.set_level(logging.INFO, logger="kiln.codegen_triton.output_code")
    caplog.set_level(logging.INFO, logger="kiln.loopir.output_code")
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="kiln.dynamic"):
        for n, m in _SIZES:
            x, y = torch.randn(n, m, device="cuda"), torch.randn(n, m, device="cuda")
            torch.testing.assert_close(compiled(x, y), fn(x, y), atol=1e-4, rtol=1e-4)
    stats = counters.snapshot()["stats"]
    _check_once(stats, caplog.text)
    kernels = counters.snapshot()["codegen_triton"]["kernels"]
    assert kernels >= 1
    # the generated code alone: other log lines (timings, sizes seen) may hold those numbers
    code_loggers = ("kiln.codegen_triton.output_code", "kiln.loopir.output_code")
    text = "\n".join(r.getMessage() for r in caplog.records if r.name in code_loggers)
    assert "@triton.jit" in text and "def call(" in text, "no kernel or wrapper was logged"
    assert not re.search(r"\b(37|53)\b", text), "a dynamic size was baked into generated code"
    assert "s0 = " in text  # the wrapper binds the size once per call


def test_half_precision_softmax() -> None:
    compiled = kiln.compile(_softmaxes, dynamic=True, options={"dynamic_kernels": True})
    for n, m in _SIZES:
        x = torch.randn(n, m, device="cuda", dtype=torch.float16)
        torch.testing.assert_close(compiled(x, x), _softmaxes(x, x), atol=2e-3, rtol=2e-3)
    _check_once(counters.snapshot()["stats"])


def test_training_step() -> None:
    lin = torch.nn.Linear(24, 24).cuda()

    def step(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(lin(x)).softmax(-1).sum()

    compiled = kiln.compile(step, dynamic=True, options={"dynamic_kernels": True})
    for rows in (37, 53, 5):
        x = torch.randn(rows, 24, device="cuda", requires_grad=True)
        compiled(x).backward()
        x2 = x.detach().clone().requires_grad_()
        step(x2).backward()
        torch.testing.assert_close(x.grad, x2.grad, atol=1e-4, rtol=1e-4)
    _check_once(counters.snapshot()["stats"])


def test_cuda_graphs_one_recording_per_size() -> None:
    fn = _softmaxes
    compiled = kiln.compile(
        fn, dynamic=True, mode="reduce-overhead", options={"dynamic_kernels": True}
    )
    rows = [37, 53, 37, 5, 53, 37]
    with torch.no_grad():
        for n in rows:
            x = torch.randn(n, 40, device="cuda")
            torch.testing.assert_close(compiled(x, x), fn(x, x), atol=1e-5, rtol=1e-5)
    _check_once(counters.snapshot()["stats"])
    assert counters.snapshot()["codegen_triton"]["cudagraphs_recorded"] == len(set(rows))
    # more sizes than kept: the least recently used recording goes, and records again
    with torch.no_grad():
        for n in [*range(6, 6 + cudagraphs.GRAPHS_KEPT), 37]:
            x = torch.randn(n, 40, device="cuda")
            torch.testing.assert_close(compiled(x, x), fn(x, x), atol=1e-5, rtol=1e-5)
    recorded = counters.snapshot()["codegen_triton"]["cudagraphs_recorded"]
    assert recorded == len(set(rows)) + cudagraphs.GRAPHS_KEPT + 1


def test_static_and_symbolic_agree() -> None:
    x = torch.randn(37, 53, device="cuda")
    static = kiln.compile(_reductions, dynamic=False)(x, x)
    kiln.reset()
    symbolic = kiln.compile(_reductions, dynamic=True, options={"dynamic_kernels": True})(x, x)
    torch.testing.assert_close(static, symbolic, atol=1e-5, rtol=1e-5)
