"""Custom torch.autograd.Function calls: one node after forward and backward were traced."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kiln.capture import Unsupported, capture, explain
from kiln.capture.autograd_function import is_apply

SCALE = 0.5
HISTORY: list[int] = []
TABLE = torch.ones(4)


class ClippedGrad(torch.autograd.Function):
    """Forward is the identity; backward clips the gradient (not the forward's derivative)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bound: float) -> torch.Tensor:
        ctx.bound = bound
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g.clamp(-ctx.bound, ctx.bound), None


class GlobalScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * x * SCALE


class PrintingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        HISTORY.append(1)
        return g * 2


class GlobalTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x + TABLE

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class DataDependentBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * float(g.sum().item())


def clipped(x: torch.Tensor) -> torch.Tensor:
    return ClippedGrad.apply(x.sin() * 4, 0.25).cos()


def global_scale(x: torch.Tensor) -> torch.Tensor:
    return GlobalScale.apply(x) + 1


def _capture(fn: Any, *args: Any, fullgraph: bool = False) -> Any:
    return capture(
        fn,
        args,
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
        fullgraph=fullgraph,
    )


def _grads(fn: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_()
    out = fn(x)
    out.backward(torch.randn_like(out, generator=torch.Generator().manual_seed(1)))
    assert x.grad is not None
    return out.detach(), x.grad


def test_apply_is_recognised() -> None:
    assert is_apply(ClippedGrad.apply)
    assert not is_apply(torch.sin)
    assert not is_apply(ClippedGrad.forward)


@pytest.mark.parametrize("fn", [clipped, global_scale])
def test_one_graph_with_fullgraph_and_eager_gradients(fn: Any) -> None:
    x = torch.randn(6, requires_grad=True)
    result = _capture(fn, x, fullgraph=True)
    assert len(result.graphs) == 1 and not result.graph_breaks
    targets = [n.target for n in result.graphs[0].graph.nodes if n.op == "call_function"]
    assert any(getattr(t, "autograd_function", None) is not None for t in targets)
    for _ in range(3):
        x = torch.randn(6)
        out, grad = _grads(result.function, x)
        ref_out, ref_grad = _grads(fn, x)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(grad, ref_grad)


def test_custom_backward_differs_from_derivative() -> None:
    """The graph keeps the user's backward: the clipped gradient, not the true one."""
    x = torch.linspace(-2.0, 2.0, 6)  # points whose true gradient lies outside the clip range
    result = _capture(clipped, x.requires_grad_())
    _, grad = _grads(result.function, x)
    _, true_grad = _grads(lambda t: (t.sin() * 4).cos(), x)
    assert not torch.allclose(grad, true_grad)


def test_state_read_by_backward_is_guarded() -> None:
    result = _capture(global_scale, torch.randn(3, requires_grad=True))
    assert any(str(g.source) == "G['SCALE']" for g in result.guards)


@pytest.mark.parametrize(
    ("fn_cls", "phrase"),
    [
        (PrintingBackward, "PrintingBackward.backward changes state"),
        (GlobalTensor, "reads a tensor that is not an argument"),
        (DataDependentBackward, "DataDependentBackward.backward"),
    ],
)
def test_unsound_methods_break_with_the_reason(fn_cls: Any, phrase: str) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return fn_cls.apply(x * 2) + 1

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(Unsupported) as info:
        _capture(fn, x, fullgraph=True)
    assert info.value.kind == "autograd_function" and phrase in str(info.value)
    report = explain(fn)(x)
    assert report.graph_break_count == 1
    assert report.breaks[0].kind == "autograd_function"
    HISTORY.clear()
    out, grad = _grads(_capture(fn, x).function, x)
    assert HISTORY == ([1] if fn_cls is PrintingBackward else [])
    ref_out, ref_grad = _grads(fn, x)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(grad, ref_grad)


FACTORS = [2.0, 3.0]


class ReadsGlobalList(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * FACTORS[0]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * FACTORS[1]


def test_reading_a_global_list_is_no_side_effect() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return ReadsGlobalList.apply(x) + 1

    x = torch.randn(4, requires_grad=True)
    result = _capture(fn, x, fullgraph=True)
    assert not result.side_effects
    _, grad = _grads(result.function, x)
    torch.testing.assert_close(grad, _grads(fn, x)[1])


class PrintsWhenGradMissing(torch.autograd.Function):
    """Backward has a side effect only where a gradient is None (not materialized)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx: Any, ga: Any, gb: Any) -> Any:
        if gb is None:
            HISTORY.append(2)
            return ga * 2
        return ga * 2 + gb * 3


def test_backward_is_checked_for_gradients_not_materialized() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        a, _ = PrintsWhenGradMissing.apply(x)
        return a

    with pytest.raises(Unsupported, match="PrintsWhenGradMissing.backward changes state"):
        _capture(fn, torch.randn(3, requires_grad=True), fullgraph=True)


class RaisingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("no backward")


def test_exception_in_backward_is_a_break_not_a_raise_in_forward() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        try:
            y = RaisingBackward.apply(x)
        except NotImplementedError:
            y = x * 100
        return y + 1

    x = torch.randn(3, requires_grad=True)
    report = explain(fn)(x)
    assert [b.kind for b in report.breaks] == ["autograd_function"]
    result = _capture(fn, x)
    torch.testing.assert_close(result.function(x), fn(x))
