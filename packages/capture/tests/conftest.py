"""Shared harness for capture tests: capture with a trivial backend, compare with eager."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from kiln.capture import CaptureResult, capture


def op_names(gm: torch.fx.GraphModule) -> list[str]:
    """The ops of a graph in order: function ``__name__`` or method name."""
    names = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            names.append(getattr(n.target, "__name__", str(n.target)))
        elif n.op == "call_method":
            names.append(str(n.target))
    return names


def clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        c = x.detach().clone()
        return c.requires_grad_(x.requires_grad) if x.is_leaf else c
    if type(x) in (list, tuple):
        return type(x)(clone(v) for v in x)
    if type(x) is dict:
        return {k: clone(v) for k, v in x.items()}
    return x


def assert_same(actual: Any, expected: Any) -> None:
    """Equal values, types and container shapes; tensors with assert_close and equal grad flags."""
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected)
        assert actual.requires_grad == expected.requires_grad
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected)
        for k in expected:
            assert_same(actual[k], expected[k])
    elif dataclasses.is_dataclass(expected):
        assert type(actual) is type(expected)
        for f in dataclasses.fields(expected):
            assert_same(getattr(actual, f.name), getattr(expected, f.name))
    elif type(expected).__module__ == "builtins" or isinstance(expected, (torch.dtype, torch.Size)):
        assert actual == expected
    else:
        assert type(actual) is type(expected)


def run_capture(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    graphs: int = 1,
    ops: list[str] | None = None,
) -> CaptureResult:
    """Capture ``fn``, check graph count and ops, then run both ways on clones and compare."""
    kwargs = kwargs or {}
    result = capture(
        fn,
        clone(args),
        clone(kwargs),
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )
    assert len(result.graphs) == graphs, [g.code for g in result.graphs]
    if ops is not None:
        assert (op_names(result.graphs[0]) if result.graphs else []) == ops
    eager_args, eager_kwargs = clone(args), clone(kwargs)
    torch.manual_seed(0)
    expected = fn(*eager_args, **eager_kwargs)
    compiled_args, compiled_kwargs = clone(args), clone(kwargs)
    torch.manual_seed(0)
    actual = result.function(*compiled_args, **compiled_kwargs)
    assert_same(actual, expected)
    assert_same(compiled_args, eager_args)
    return result


@pytest.fixture
def check() -> Callable[..., CaptureResult]:
    return run_capture
