"""Numpy on arrays made from tensors: torch ops in the graph, numpy objects where Python sees them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from kiln.capture import CaptureResult, capture


def _capture(fn: Callable[..., Any], args: tuple[Any, ...]) -> CaptureResult:
    return capture(fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f)


def _same(actual: Any, expected: Any) -> None:
    """Equal numpy objects (type, dtype, shape, values), tensors and tuples of them."""
    assert type(actual) is type(expected), (type(actual), type(expected))
    if isinstance(expected, tuple):
        for a, e in zip(actual, expected, strict=True):
            _same(a, e)
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected)
    elif isinstance(expected, np.ndarray | np.generic):
        assert actual.dtype == expected.dtype and np.shape(actual) == np.shape(expected)
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    else:
        assert actual == expected


def check(fn: Callable[..., Any], *args: torch.Tensor, graphs: int = 1) -> CaptureResult:
    """Capture ``fn``, assert the graph count and compare with eager on clones."""
    result = _capture(fn, tuple(a.clone() for a in args))
    assert len(result.graphs) == graphs, [b.explanation for b in result.graph_breaks]
    eager_args = tuple(a.clone() for a in args)
    compiled_args = tuple(a.clone() for a in args)
    _same(result.function(*compiled_args), fn(*eager_args))
    for a, e in zip(compiled_args, eager_args, strict=True):
        torch.testing.assert_close(a, e)
    return result


def ops(result: CaptureResult) -> list[str]:
    return [
        getattr(n.target, "__name__", str(n.target))
        for n in result.graphs[0].graph.nodes
        if n.op in ("call_function", "call_method")
    ]


def ufuncs_and_reductions(x):
    a = x.numpy()
    b = np.tanh(a) * 2 + np.exp(-np.abs(a)).mean(axis=1, keepdims=True)
    return torch.from_numpy(np.maximum(b, 0.5)) + x


def test_ufuncs_reductions_and_operators_are_one_graph():
    result = check(ufuncs_and_reductions, torch.randn(4, 6))
    assert "tanh" in ops(result) and "maximum" in ops(result)
    assert not result.graph_breaks


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.numpy().sum(),  # a reduction over everything is a numpy scalar
        lambda x: np.sqrt(np.abs(x.numpy())),  # an array
        lambda x: x.numpy().std(),  # ddof=0, unlike torch.std
        lambda x: np.var(x.numpy(), axis=0, ddof=1),
        lambda x: x.numpy().max(axis=1),
        lambda x: (x.numpy().argmax(), x.numpy().argmin(axis=0)),
        lambda x: np.prod(x.numpy() + 1.0, axis=(0, 1), keepdims=True),
        lambda x: (x.numpy() > 0).any(axis=1),
        lambda x: np.clip(x.numpy(), -0.5, 0.5),
        lambda x: np.where(x.numpy() > 0, x.numpy(), 0.0),
        lambda x: 2.0 - x.numpy() ** 2 / 3,
        lambda x: -abs(x.numpy()) @ x.numpy().T,
        lambda x: np.dot(x.numpy(), x.numpy().transpose()),
        lambda x: np.tanh(x.numpy()[0, 1]),  # a scalar in, a scalar out
        lambda x: x.numpy()[:, 1:3].reshape(-1),
        lambda x: x.numpy().reshape(2, -1).T.copy(),
        lambda x: np.expand_dims(x.numpy(), (0, 2)).squeeze(0),
        lambda x: np.concatenate([x.numpy(), x.numpy() * 2], axis=1),
        lambda x: np.concatenate((x.numpy(), x.numpy()), axis=None),  # flattens first
        lambda x: x.numpy().sum(axis=None, out=None),
        lambda x: np.stack((x.numpy(), x.numpy()), axis=0).astype(np.float64),
        lambda x: (
            x.reshape(x.numpy().shape[::-1]) * x.numpy().ndim + x.numpy().size + len(x.numpy())
        ),
        lambda x: isinstance(x.numpy(), np.ndarray) and isinstance(x.numpy().sum(), np.float32),
    ],
)
def test_results_match_numpy_in_type_dtype_and_value(fn):
    check(fn, torch.randn(4, 6))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.numpy() / 2,  # int64 / int is float64
        lambda x: x.numpy().mean(),  # the mean of ints is a float64
        lambda x: x.numpy().sum(axis=0),
        lambda x: np.sqrt(x.numpy()),
        lambda x: x.numpy() // 3 + x.numpy() % 3,
        lambda x: x.numpy().astype(np.float32) + x.numpy(),  # float32 + int64 is float64
    ],
)
def test_integer_arrays_promote_as_numpy_does(fn):
    check(fn, torch.randint(1, 100, (3, 5)))


def scale_by_statistic(x):
    h = torch.relu(x)
    s = float(np.tanh(h.detach().numpy().mean())) + 1.0  # float() needs the value: a break
    return h * s


def test_the_graph_runs_up_to_the_float_that_needs_the_value():
    result = check(scale_by_statistic, torch.randn(8, 8))
    assert ops(result) == ["relu", "detach", "mean", "tanh"]
    assert [b.kind for b in result.graph_breaks] == ["data_dependent_value"]


def branch_on_array(x):
    a = x.numpy()
    if a.mean() > 0:  # the truth of a numpy bool: a break
        return x + 1
    return x - 1


def test_a_branch_on_an_array_breaks_and_takes_the_right_side():
    for sign in (1, -1):
        result = check(branch_on_array, sign * torch.rand(5), graphs=1)
        assert [b.kind for b in result.graph_breaks] == ["data_dependent_branch"]


def writes_through_array(x):
    y = x * 2
    a = x.numpy()
    a += 1  # numpy writes x's memory: runs natively after a break
    return x * y


def test_in_place_numpy_updates_write_the_tensor():
    result = check(writes_through_array, torch.randn(3))
    assert [b.kind for b in result.graph_breaks] == ["side_effect"]


def array_sees_later_tensor_writes(x):
    a = x.numpy()
    x.add_(1)
    return torch.from_numpy(a) * 2, torch.tensor(a)


def test_an_array_shares_its_tensor_memory():
    check(array_sees_later_tensor_writes, torch.randn(4))


@pytest.mark.parametrize(
    "make",
    [lambda: torch.randn(3, requires_grad=True), lambda: torch.randn(3, dtype=torch.bfloat16)],
)
def test_tensors_numpy_refuses_raise_eagers_error(make):
    def fn(x):
        return np.tanh((x * 2).numpy())

    with pytest.raises((RuntimeError, TypeError)) as expected:
        fn(make())
    result = _capture(fn, (make(),))
    with pytest.raises(type(expected.value)):
        result.function(make())
    assert result.graph_breaks[0].kind == "data_dependent_value"


def test_numpy_calls_on_constants_fold():
    def fn(x):
        return x * float(np.sqrt(9.0)) + np.tanh(0.5)

    result = check(fn, torch.randn(3))
    assert ops(result) == ["mul", "add"]


def arctanh_of_half(x):
    return torch.from_numpy(np.arctanh(x.numpy() * 0.5))


def test_numpy_stand_ins_print_no_warnings(recwarn):
    """The stand-ins are ones: arctanh(1) overflows there, never on the user's values."""
    check(arctanh_of_half, torch.rand(4, 4))
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
