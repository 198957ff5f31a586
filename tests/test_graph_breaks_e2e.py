"""Graph breaks through kiln.compile: partial graphs, continuations compiled when reached."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import kiln
from kiln.capture import counters


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


class Recording:
    """A backend that keeps every graph it is given and runs it as is."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    @property
    def ops(self) -> list[list[str]]:
        return [
            [
                getattr(n.target, "__name__", str(n.target))
                for n in g.graph.nodes
                if n.op.startswith("call")
            ]
            for g in self.graphs
        ]


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


def test_toy_example_three_graphs_over_both_signs():
    backend = Recording()
    f = kiln.compile(toy_example, backend=backend)
    for _ in range(2):
        for sign in (1, -1):
            a, b = torch.randn(10), sign * torch.randn(10).abs()
            torch.testing.assert_close(f(a, b), toy_example(a, b))
    assert backend.ops == [["abs", "add", "truediv", "sum", "lt"], ["mul"], ["mul", "mul"]]
    assert counters.counters["graph_breaks"]["data_dependent_branch"] == 1


_variable = 0


def example3(x):
    global _variable
    _variable += 1
    return torch.rand(10) + x


def test_example3_counter_and_randomness():
    f = kiln.compile(example3, backend="eager")
    x = torch.randn(10)
    for seed in range(3):
        start = _variable
        torch.manual_seed(seed)
        expected = torch.rand(10) + x
        torch.manual_seed(seed)
        torch.testing.assert_close(f(x), expected)
        assert _variable == start + 1


def loop_with_numpy(x):
    for i in range(5):
        x = x * float(np.float32(1.5)) + i
        print("step", i)
    return x


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_break_in_loop_matches_eager(backend, capsys):
    f = kiln.compile(loop_with_numpy, backend=backend)
    for _ in range(2):
        x = torch.randn(4)
        torch.testing.assert_close(f(x), loop_with_numpy(x))
    out = capsys.readouterr().out
    assert out.count("step 4") == 4


def item_branch(x, ys):
    ys.append(x.sum())
    if x.mean().item() > 0:
        return x.relu(), len(ys)
    return x.sigmoid(), len(ys)


def test_item_branch_with_mutation_through_kiln_backend():
    f = kiln.compile(item_branch)
    for sign in (1, -1, 1):
        x = sign * torch.randn(6).abs()
        ys, ys_eager = [], []
        actual, expected = f(x, ys), item_branch(x, ys_eager)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(ys, ys_eager)


def test_explain_reports_the_break():
    report = kiln.capture.explain(toy_example)(torch.randn(4), torch.randn(4))
    assert report.graph_count == 2
    assert report.graph_break_count == 1
    assert "if b.sum() < 0:" in str(report)


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 8)
        self.l2 = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.l1(x).relu()
        if h.mean() > 0.1:
            h = h * 2
        print("hidden", tuple(h.shape))
        return self.l2(h)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_module_with_breaks_is_compiled_around_them(backend):
    model = Branchy()
    ref = Branchy()
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, backend=backend)
    for _ in range(3):
        x = torch.randn(4, 8)
        out, expected = compiled(x), ref(x)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(model.l1.weight.grad, ref.l1.weight.grad)
    assert kiln.stats().graphs_compiled >= 2


class NumpyBreak(torch.nn.Module):
    """benchmarks' graph_break_numpy: a numpy method of a fresh array, then a branch on a tensor."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(16, 16)
        self.second = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = torch.relu(self.first(x))
        scale = float(np.tanh(h.detach().float().cpu().numpy().mean())) + 1.0
        h = h * scale if h.mean() > 0.5 else h - scale
        return self.second(h)


def test_a_method_of_a_fresh_array_is_not_captured_again_on_every_call():
    model = NumpyBreak()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(10):
            torch.testing.assert_close(compiled(x), model(x))
    assert not [w for w in caught if "recompile limit" in str(w.message)]
    stats = kiln.stats()
    # the module's wrapper frame (its continuation only returns forward's result, so it is
    # called directly, never captured), forward and one continuation per break (float() and
    # the branch; the numpy calls are in the first graph)
    assert (stats.recompiles, stats.graphs_compiled, stats.frames_captured) == (0, 3, 4)


def numpy_then_branch(x):
    h = torch.relu(x)
    s = np.tanh(h.detach().numpy().mean())
    return h * torch.as_tensor(s) if h.mean() > 0.4 else h - 1


def test_fresh_inputs_through_numpy_reuse_the_captured_frames():
    f = kiln.compile(numpy_then_branch, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(10):
            x = torch.randn(32)
            torch.testing.assert_close(f(x), numpy_then_branch(x))
    assert not caught
    assert kiln.stats().recompiles == 0
