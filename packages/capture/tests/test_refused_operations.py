"""Operations Python refuses by the operand's type raise in the traced program, and library
code whose compiled path raises is traced along eager's.

``None[...]``, ``len(None)``, ``x in None``, item assignment to a tuple: Python raises a
TypeError whatever the other operands are. The trace raises it too, so the program's own
handlers catch it in one graph, and an uncaught one makes the frame run eagerly. A graph
break would run the operation in Python after the graph instead.

``torch.compiler.is_compiling()`` is True while capturing and False in eager, and library
code may raise only on its compiled path (transformers' encoders leave the default attention
mask None there, then subscript it). Where the compiled path raises, the place that asked
last answers as eager does and the frame is traced again, so a Kiln run never raises where
eager does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kiln.capture import Unsupported, capture
from kiln.capture.breaks.rollback import break_state


def _capture(fn: Callable[..., Any], *args: Any) -> Any:
    return capture(fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f)


def _ops(result: Any) -> list[str]:
    nodes = result.graphs[0].graph.nodes
    return [getattr(n.target, "__name__", n.target) for n in nodes if n.op.startswith("call")]


def _masked(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    # transformers' encoders build the default mask only in eager, then subscript it
    if mask is None and not torch.compiler.is_compiling():
        mask = torch.ones(x.shape[0], x.shape[1])
    bias = mask[:, None, None, :]  # type: ignore[index]
    return x[:, None] * (1.0 - bias)


def _calls_masked(x: torch.Tensor) -> torch.Tensor:
    return _masked(x * 2) + 1


def _block_mask(mask: torch.Tensor) -> torch.Tensor:
    if mask.shape[1] % 2:  # an AttributeError for a None mask
        mask = torch.nn.functional.pad(mask, (0, 1))
    return mask.reshape(mask.shape[0], -1, 2)


def _passes_mask_on(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    # longt5: the frame that leaves the mask None is not the one that raises
    if mask is None and not torch.compiler.is_compiling():
        mask = torch.ones(x.shape[0], x.shape[1])
    return x * _block_mask(mask).sum(-1).sum(-1, keepdim=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fn,shape",
    [(_masked, (2, 3)), (_calls_masked, (2, 3)), (_passes_mask_on, (2, 5))],
    ids=["frame", "inlined", "passed-on"],
)
def test_compiled_path_that_raises_is_traced_as_eager_runs_it(fn, shape):
    result = _capture(fn, torch.randn(*shape))
    assert len(result.graphs) == 1 and not result.graph_breaks
    assert "ones" in _ops(result)
    for _ in range(3):
        x = torch.randn(*shape)
        torch.testing.assert_close(result.function(x), fn(x))


def test_only_the_place_that_led_to_the_exception_answers_as_eager():
    def fn(x, mask=None):
        y = x + 1 if torch.compiler.is_compiling() else x - 1  # the compiled path stays
        return _masked(y, mask)

    result = _capture(fn, torch.randn(2, 3))
    assert _ops(result)[0] == "add"
    x = torch.randn(2, 3)
    torch.testing.assert_close(result.function(x), _masked(x + 1))


def test_exception_on_both_paths_runs_the_frame_eagerly():
    def fn(x, mask=None):
        if torch.compiler.is_compiling():
            x = x + 1
        return x[None], mask[0]

    with pytest.raises(Unsupported) as info:
        _capture(fn, torch.randn(3))
    assert info.value.kind == "user_exception"
    assert break_state(info.value) is None  # never split: the rest would raise in Python


def _subscript(x, v):
    return v[x.shape[0], x]


def _assign(x, v):
    v[0] = x


def _delete(x, v):
    del v[x.shape[0]]


def _length(x, v):
    return len(v)


def _iterate(x, v):
    return [x for _ in v]


def _member(x, v):
    return x in v


def _negate(x, v):
    return -v


_REFUSED = [
    (_subscript, None),
    (_subscript, 3),
    (_assign, None),
    (_assign, (1, 2)),
    (_assign, "ab"),
    (_delete, None),
    (_delete, (1, 2)),
    (_length, None),
    (_length, 3),
    (_iterate, None),
    (_iterate, 3.0),
    (_member, None),
    (_member, 3),
    (_negate, None),
    (_negate, (1, 2)),
]


@pytest.mark.parametrize(
    "op,value", _REFUSED, ids=[f"{op.__name__[1:]}-{type(v).__name__}" for op, v in _REFUSED]
)
def test_refused_operation_is_caught_by_the_program(op, value):
    def fn(x):
        try:
            op(x, value)
        except TypeError as e:
            return x + 1, str(e)
        return x - 1, ""

    result = _capture(fn, torch.randn(3))
    assert len(result.graphs) == 1 and not result.graph_breaks
    for _ in range(3):
        x = torch.randn(3)
        got, want = result.function(x), fn(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] != ""


@pytest.mark.parametrize(
    "op,value", _REFUSED, ids=[f"{op.__name__[1:]}-{type(v).__name__}" for op, v in _REFUSED]
)
def test_uncaught_refusal_runs_the_frame_eagerly(op, value):
    def fn(x):
        y = x * 2
        op(y, value)
        return y

    with pytest.raises(Unsupported) as info:
        _capture(fn, torch.randn(3))
    assert info.value.kind == "user_exception"
    assert break_state(info.value) is None
