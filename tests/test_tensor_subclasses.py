"""Tensor subclass inputs in one graph, against eager.

A ``__torch_function__`` subclass (an override that counts and rescales, or ``Tensor``'s own,
which makes ops return the subclass) is traced through its override into plain ops; results
eager returns as the subclass are rewrapped. A ``__torch_dispatch__`` wrapper subclass with the
flatten protocol (a tensor holding data and a scale) is desugared at the ATen level by
autograd_aot. Each program runs with ``fullgraph=True`` several times on fresh inputs with each
backend and must give eager's values, types and gradients; a plain tensor after a subclass one
recompiles.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kiln

BACKENDS = ["eager", "aot_eager", "kiln"]


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    yield
    kiln.reset()


class Counted(torch.Tensor):
    """A ``__torch_function__`` subclass: doubles ``mul``'s scalar and leaves the rest to
    ``Tensor``'s override (which returns ``Counted`` results)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.mul and isinstance(args[1], (int, float)):
            args = (args[0], args[1] * 2)
        return super().__torch_function__(func, types, args, kwargs)


class Tagged(torch.Tensor):
    """No override of its own: ``Tensor.__torch_function__`` keeps results ``Tagged``."""


def _compile(fn: Any, backend: str) -> tuple[Any, list[torch.fx.GraphModule]]:
    graphs: list[torch.fx.GraphModule] = []

    def counting(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return kiln.backends.lookup_backend(backend)(gm, inputs)

    return kiln.compile(fn, fullgraph=True, backend=counting), graphs


def _plain(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def _function_program(x: torch.Tensor, y: torch.Tensor) -> Any:
    z = (x * 3 + y).sin()
    m = torch.max(z, 0)
    return z.sum(1) * 2, m.values, z.shape[0], isinstance(z, Counted)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_function_subclass_input(backend: str) -> None:
    compiled, graphs = _compile(_function_program, backend)
    for n in (4, 4, 4):
        base, y = torch.randn(n, 5), torch.randn(n, 5)
        x = base.as_subclass(Counted)
        expected = _function_program(x, y)
        got = compiled(base.as_subclass(Counted), y)
        assert [type(v) for v in got] == [type(v) for v in expected]
        assert type(got[0]) is Counted and got[3] is True
        torch.testing.assert_close(_plain(got[0]), _plain(expected[0]))
        torch.testing.assert_close(_plain(got[1]), _plain(expected[1]))
        assert got[2] == expected[2]
    assert len(graphs) == 1
    ops = [n for n in graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    assert ops and all(not isinstance(n.meta["val"], Counted) for n in ops)


def _tagged_program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w).relu() + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_function_subclass_gradients(backend: str) -> None:
    """Training through ``Tensor``'s own override: the result is ``Tagged`` and the gradients
    of the subclass input and of a plain weight are eager's."""
    compiled, graphs = _compile(_tagged_program, backend)
    for _ in range(3):
        data, w0 = torch.randn(6, 4), torch.randn(4, 3)
        x, w = data.clone().as_subclass(Tagged).requires_grad_(), w0.clone().requires_grad_()
        ex, ew = data.clone().as_subclass(Tagged).requires_grad_(), w0.clone().requires_grad_()
        got, expected = compiled(x, w), _tagged_program(ex, ew)
        assert type(got) is type(expected) is Tagged
        torch.testing.assert_close(_plain(got), _plain(expected))
        got.sum().backward()
        expected.sum().backward()
        assert x.grad is not None and ex.grad is not None and w.grad is not None
        torch.testing.assert_close(_plain(x.grad), _plain(ex.grad))
        torch.testing.assert_close(w.grad, ew.grad)
    assert len(graphs) == 1


def test_plain_tensor_after_subclass_recompiles() -> None:
    """The input's exact type is guarded: a plain tensor gets its own graph (plain results)."""
    compiled, graphs = _compile(_tagged_program, "eager")
    x, w = torch.randn(6, 4), torch.randn(4, 3)
    assert type(compiled(x.as_subclass(Tagged), w)) is Tagged
    out = compiled(x, w)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, _tagged_program(x, w))
    assert len(graphs) == 2
