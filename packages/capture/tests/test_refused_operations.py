"""Operations Python refuses by the operand's type raise in the traced program.

``None[...]``, ``len(None)``, ``x in None``, item assignment to a tuple: Python raises a
TypeError whatever the other operands are. The trace raises it too, so the program's own
handlers catch it in one graph, and an uncaught one makes the frame run eagerly. A graph
break would run the operation in Python after the graph instead, which raises where eager
does not when the trace took the library's compiled path (``torch.compiler.is_compiling()``
is True while capturing, False in eager).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kiln.capture import Unsupported, capture, explain
from kiln.capture.breaks.rollback import break_state


def _capture(fn: Callable[..., Any], *args: Any) -> Any:
    return capture(fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f)


def _masked(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    # transformers' encoders build the default mask only in eager, then subscript it
    if mask is None and not torch.compiler.is_compiling():
        mask = torch.ones(x.shape[0], x.shape[1])
    bias = mask[:, None, None, :]  # type: ignore[index]
    return x[:, None] * (1.0 - bias)


def _calls_masked(x: torch.Tensor) -> torch.Tensor:
    return _masked(x * 2) + 1


@pytest.mark.parametrize("fn", [_masked, _calls_masked], ids=["frame", "inlined"])
def test_compiled_path_that_raises_runs_eagerly(fn):
    with pytest.raises(Unsupported) as info:
        _capture(fn, torch.randn(2, 3))
    assert info.value.kind == "user_exception"
    assert "not subscriptable" in info.value.explanation
    assert break_state(info.value) is None  # never split: the rest would raise in Python
    for _ in range(3):
        x = torch.randn(2, 3)
        report = explain(fn)(x)
        torch.testing.assert_close(report.result, fn(x))
        assert [f.reason.kind for f in report.gave_up] == ["user_exception"]


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
