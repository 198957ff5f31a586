"""Seeing inside a compiled program: profiler ranges, reports in the user's words, modes that
say what they do."""

from __future__ import annotations

import logging
import re

import pytest
import torch

import kiln
from kiln import loopir


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)).softmax(-1) * 2 + x.sin()


def _kernel_ranges(caplog: pytest.LogCaptureFixture) -> set[str]:
    """Every kernel range the generated wrappers name (one per launch line)."""
    text = "\n".join(r.getMessage() for r in caplog.records if r.name.endswith("output_code"))
    return set(re.findall(r"# range (\S+)", text))


def _profile(fn, *args):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn(*args)
    return out, {e.key for e in prof.key_averages()}


def test_profiler_names_the_region_and_every_kernel(caplog: pytest.LogCaptureFixture) -> None:
    model = Block()
    compiled = kiln.compile(model)
    with caplog.at_level(logging.INFO, logger="kiln.loopir.output_code"), torch.no_grad():
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), model(x))
    kernels = _kernel_ranges(caplog)
    assert kernels and all(k.startswith("kiln_cpp_") for k in kernels)
    assert sum(kiln.stats().kernels.values()) == len(kernels)
    for _ in range(2):  # the profiled body is built once, then reused; results stay eager's
        x = torch.randn(4, 8)
        with torch.no_grad():
            out, names = _profile(compiled, x)
            torch.testing.assert_close(out, model(x))
        assert "kiln: Block.forward graph 0" in names
        assert kernels <= names
    with torch.no_grad():  # and unprofiled calls after it still run the plain body
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), model(x))


def test_profiler_names_forward_and_backward_and_graphs_after_a_break() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.cos() * 2
        y.detach().sum().item()  # a graph break: the rest is the function's graph 1
        return (y.exp() + 1).sum()

    compiled = kiln.compile(f)
    for _ in range(2):
        x = torch.randn(5, requires_grad=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = compiled(x)
            out.backward()
        names = {e.key for e in prof.key_averages()}
        ref = x.detach().requires_grad_()
        f(ref).backward()
        torch.testing.assert_close(x.grad, ref.grad)
        assert {"kiln: f graph 0", "kiln: f graph 1"} <= names
        assert {"kiln: f graph 0 backward", "kiln: f graph 1 backward"} <= names
        assert any(n.startswith("kiln_cpp_") for n in names)


def test_the_unprofiled_body_does_no_profiling_work(caplog: pytest.LogCaptureFixture) -> None:
    """One flag check per call; kernel launches in the plain body are bare calls."""
    with caplog.at_level(logging.INFO, logger="kiln.loopir.output_code"), torch.no_grad():
        kiln.compile(Block())(torch.randn(4, 8))
    source = next(r.getMessage() for r in caplog.records if r.name.endswith("output_code"))
    body = source.split("def call(args):", 1)[1]
    assert body.count("_is_profiler_enabled") == 1 and body.count("_profiled(") == 1
    assert "record" not in body and "with " not in body


def test_naming_region_names_graphs_compiled_inside() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x.sin() + 1)
    with loopir.naming_region("kiln: mine graph 7"):
        fn = loopir.compile_fx(gm, [torch.randn(3)])
    x = torch.randn(3)
    with torch.no_grad():
        out, names = _profile(fn, x)
    torch.testing.assert_close(out, x.sin() + 1)
    assert "kiln: mine graph 7" in names
