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


class Breaking(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        scale = y.sum().item()  # the one graph break
        return y * scale


def test_one_break_inside_a_module_is_counted_once(caplog: pytest.LogCaptureFixture) -> None:
    model = Breaking()
    compiled = kiln.compile(model)
    with caplog.at_level(logging.INFO, logger="kiln.capture.graph_breaks"):
        for _ in range(2):
            x = torch.randn(2, 4)
            torch.testing.assert_close(compiled(x), model(x))
    logged = [r for r in caplog.records if r.getMessage().startswith("graph break")]
    assert len(logged) == 1 and "scale = y.sum().item()" in logged[0].getMessage()
    assert "Breaking.forward" in logged[0].getMessage()
    assert kiln.stats().graph_breaks == 1
    kiln.reset()
    report = kiln.explain(Breaking())(torch.randn(2, 4))
    assert report.graph_break_count == 1 and report.graph_count == 2


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = x * y.size(1)
        scale = z.sum().item()
        return self.drop(z) * scale


def test_recompile_messages_name_the_users_variables_and_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = Scaled()
    compiled = kiln.compile(model, dynamic=False)
    with caplog.at_level(logging.INFO, logger="kiln.guards.recompiles"):
        for n in (3, 5):
            x, y = torch.randn(3), torch.randn(2, n)
            torch.testing.assert_close(compiled(x, y), model(x, y))
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "kiln.guards.recompiles")
    assert "recompiling Scaled.forward (" in text
    assert "test_seeing_inside.py:" in text and "`def forward(self, x: torch.Tensor" in text
    assert "tensor y size mismatch at index 1: expected 3, got 5" in text
    # the value a graph break hands on is named by the local it is stored to, at its line
    assert "`scale = z.sum().item()`, after a graph break" in text
    assert "scale changed" in text
    for generated in ("___stack", "resume_at", "_call_", "L['", "kiln/api.py"):
        assert generated not in text


def test_a_wrong_shape_raises_the_users_error_and_logs_no_break(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = Breaking()
    compiled = kiln.compile(model)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))
    with caplog.at_level(logging.INFO, logger="kiln.capture.graph_breaks"):
        for _ in range(2):  # nothing is remembered: each wrong call raises as eager does
            with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
                compiled(torch.randn(2, 5))
    assert not [r for r in caplog.records if "graph break" in r.getMessage()]
    assert kiln.stats().graph_breaks == 1  # the .item() break of the first call alone
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize(
    ("mode", "said"),
    [("max-autotune", {"autotuning", "CUDA graphs"}), ("reduce-overhead", {"CUDA graphs"})],
)
def test_a_mode_the_cpu_backend_cannot_honour_is_said_once(
    caplog: pytest.LogCaptureFixture, mode: str, said: set[str]
) -> None:
    model = Breaking()  # two graphs (a break), several calls: each request is said once
    compiled = kiln.compile(model, mode=mode)
    with caplog.at_level(logging.WARNING, logger="kiln.frontend.modes"):
        for _ in range(3):
            x = torch.randn(2, 4)
            torch.testing.assert_close(compiled(x), model(x))
    texts = [r.getMessage() for r in caplog.records if r.name == "kiln.frontend.modes"]
    assert len(texts) == len(said)
    assert all(f"Breaking.forward: mode={mode!r} asks for" in t for t in texts)
    assert {w for w in ("autotuning", "CUDA graphs") if any(w in t for t in texts)} == said
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name.endswith("modes"))


def test_the_default_mode_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kiln.frontend.modes"):
        kiln.compile(Block())(torch.randn(4, 8))
    assert not [r for r in caplog.records if r.name == "kiln.frontend.modes"]


class Branching(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.abs().sum() >= 0:  # the one graph break, the same way every call
            return y * 2
        return y


def test_one_recompile_of_a_breaking_module_is_counted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new size recompiles forward and its continuation (each compiles a new graph); the
    generated frame calling the module runs no graph, so its recompile is not counted again."""
    model = Branching()
    compiled = kiln.compile(model)
    with caplog.at_level(logging.DEBUG, logger="kiln.guards.recompiles"):
        for n in (2, 3, 5, 7, 3):
            x = torch.randn(n, 4)
            torch.testing.assert_close(compiled(x), model(x))
    records = [r for r in caplog.records if r.name == "kiln.guards.recompiles"]
    info = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert kiln.stats().recompiles == len(info) == 2
    assert "`def forward(self, x: torch.Tensor)" in info[0]
    assert "`return y * 2`, after a graph break" in info[1]
    assert all("tensor x size" in m or "tensor y size" in m for m in info)
    # the pass-through frame's recompile is still said, at debug level, once
    assert len([r for r in records if r.levelno == logging.DEBUG]) == 1
