"""A recursive capture harness for graph-break tests, and the paper's examples through it.

``Harness.wrap(fn)`` captures ``fn`` on every call (no guards here, so nothing is
reused), records every graph handed to ``compile_graph`` and every break, and
captures the continuations a break creates the same way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture import GraphBreak, Unsupported, capture
from kiln.capture.explain import op_names


class Harness:
    """Captures ``fn`` and everything it continues into, recording graphs and breaks."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.breaks: list[GraphBreak] = []
        self.eager: list[Unsupported] = []

    def compile_graph(self, gm: torch.fx.GraphModule, example: list[torch.Tensor]) -> Any:
        self.graphs.append(gm)
        return gm.forward

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                result = capture(
                    fn, args, kwargs, compile_graph=self.compile_graph, wrap_callable=self.wrap
                )
            except Unsupported as e:
                self.eager.append(e)
                return fn(*args, **kwargs)
            self.breaks.extend(result.graph_breaks)
            return result.function(*args, **kwargs)

        return call

    @property
    def ops(self) -> list[list[str]]:
        return [op_names(g) for g in self.graphs]


def same(actual: Any, expected: Any) -> None:
    """Equal results: tensors with assert_close, containers item by item, the rest with ==."""
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected)
        assert actual.requires_grad == expected.requires_grad
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            same(a, e)
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected)
        for k in expected:
            same(actual[k], expected[k])
    elif isinstance(expected, torch.nn.Module):
        same(actual.state_dict(), expected.state_dict())
    elif callable(expected):
        assert type(actual) is type(expected)
    elif hasattr(expected, "__dict__") and type(expected).__module__ != "builtins":
        assert type(actual) is type(expected)
        same(vars(actual), vars(expected))
    elif type(expected).__module__ == "builtins":
        assert actual == expected
    else:
        assert type(actual) is type(expected)


def run_both(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    reset: Callable[[], None] = lambda: None,
    state: Callable[[], Any] = lambda: None,
) -> Harness:
    """Run ``fn`` eagerly and through the harness on copies of ``args`` and compare.

    ``reset`` puts the global state the program changes back before each run and
    ``state`` returns a copy of it, compared after both runs.
    """
    eager_args = copy.deepcopy(args)
    reset()
    torch.manual_seed(0)
    expected = fn(*eager_args)
    eager_state = state()
    harness = Harness()
    compiled_args = copy.deepcopy(args)
    reset()
    torch.manual_seed(0)
    actual = harness.wrap(fn)(*compiled_args)
    same(actual, expected)
    same(compiled_args, eager_args)
    same(state(), eager_state)
    return harness


def toy_example(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


def test_toy_example_splits_into_three_graphs() -> None:
    a, b = torch.randn(10), torch.randn(10)
    negative = run_both(toy_example, (a, -b.abs()))
    positive = run_both(toy_example, (a, b.abs()))
    assert negative.ops == [["abs", "add", "truediv", "sum", "lt"], ["mul", "mul"]]
    assert positive.ops == [["abs", "add", "truediv", "sum", "lt"], ["mul"]]
    assert [b.kind for b in negative.breaks] == ["data_dependent_branch"]
    assert negative.breaks[0].frame.source == "if b.sum() < 0:"


_variable = 0


def example3(x: torch.Tensor) -> torch.Tensor:
    global _variable
    _variable += 1
    return torch.rand(10) + x


def test_example3_counts_and_draws_fresh_randomness() -> None:
    harness = Harness()
    compiled = harness.wrap(example3)
    x = torch.randn(10)
    for seed in range(3):
        start = _variable
        torch.manual_seed(seed)
        expected = torch.rand(10) + x
        torch.manual_seed(seed)
        torch.testing.assert_close(compiled(x), expected)
        assert _variable == start + 1
    assert harness.ops[0] == ["rand", "add"]
    assert not harness.breaks


def test_bytecode_artifacts_of_a_break(tmp_path) -> None:
    from kiln.capture import artifacts

    artifacts.set_debug_dir(tmp_path)
    try:
        with artifacts.frame("toy_example") as folder:
            run_both(toy_example, (torch.randn(4), -torch.randn(4).abs()))
    finally:
        artifacts.set_debug_dir(None)
    assert folder is not None
    names = sorted(p.name for p in folder.iterdir())
    assert "bytecode_original_toy_example.txt" in names
    assert "bytecode_transformed_toy_example.txt" in names
    resumes = [n for n in names if n.startswith("bytecode_resume_at_")]
    assert len(resumes) >= 2  # both branches of the jump
    text = (folder / resumes[0]).read_text()
    assert "resume_at_" in text and "RETURN_VALUE" in text
