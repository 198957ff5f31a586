"""Graph breaks through kiln.compile: partial graphs, continuations compiled when reached."""

from __future__ import annotations

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
