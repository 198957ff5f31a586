"""The emitted code: signature, defaults, closures, methods and rebuilt return values."""

from __future__ import annotations

import collections
import dataclasses
import dis
import types
from typing import NamedTuple

import pytest
import torch

from kiln.capture import capture


def r(*shape):
    return torch.randn(*shape)


def _capture(fn, *args, **kwargs):
    return capture(
        fn, args, kwargs, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f
    )


class NT(NamedTuple):
    a: torch.Tensor
    b: int


@dataclasses.dataclass
class Out:
    x: torch.Tensor
    tag: str = "t"


class Holder:
    def __init__(self, t):
        self.t = t


def test_signature_and_defaults_preserved():
    def fn(a, /, b, *rest, scale=2.0, **extra):
        return a * scale + b

    res = _capture(fn, r(2), r(2))
    new = res.function
    assert isinstance(new, types.FunctionType)
    assert new.__code__.co_varnames[:4] == fn.__code__.co_varnames[:4]
    assert new.__code__.co_argcount == fn.__code__.co_argcount
    assert new.__kwdefaults__ == {"scale": 2.0}
    a, b = r(2), r(2)
    torch.testing.assert_close(new(a, b), fn(a, b))
    assert new.__globals__ is fn.__globals__


def test_closure_preserved():
    k = r(2)

    def fn(x):
        return x * k

    res = _capture(fn, r(2))
    assert res.function.__closure__ is fn.__closure__
    assert res.code.co_freevars == fn.__code__.co_freevars
    x = r(2)
    torch.testing.assert_close(res.function(x), x * k)


def test_bound_method_rebound():
    class M(torch.nn.Module):
        def forward(self, x):
            return x + 1

    m = M()
    res = _capture(m.forward, r(2))
    assert isinstance(res.function, types.MethodType) and res.function.__self__ is m


def test_no_user_globals_added():
    before = set(globals())

    def fn(x):
        return x.sin()

    _capture(fn, r(2))
    assert set(globals()) == before


def test_compiled_graph_is_a_constant_and_gets_real_inputs():
    seen = []

    def backend(gm, inputs):
        seen.append(inputs)
        return gm.forward

    x = r(3)
    res = capture(lambda x: x * 2, (x,), {}, compile_graph=backend, wrap_callable=lambda f: f)
    assert seen[0][0] is x
    assert any(callable(c) and not isinstance(c, type) for c in res.code.co_consts)


RETURNS = [
    ("namedtuple", lambda x: NT(x + 1, 3)),
    ("dataclass_new", lambda x: Out(x * 2)),
    ("ordered_dict", lambda x: collections.OrderedDict(a=x + 1)),
    ("nested_mixed", lambda x: {"a": [x, (x * 2, None)], "b": {1, 2}, "c": 1.5}),
    ("user_object", lambda x: Holder(x - 1)),
    ("same_tensor_twice", lambda x: (x + 1,) * 2),
    ("dtype_and_size", lambda x: (x.dtype, x.shape, x.device)),
    ("slice_and_range", lambda x: (slice(1, 2), range(3), ..., x * 1)),
    ("input_passthrough", lambda x: x),
    ("string_bytes", lambda x: ("s", b"b", x + 0)),
    ("inf_nan", lambda x: (float("inf"), x + 0)),
]


@pytest.mark.parametrize("fn", [p[1] for p in RETURNS], ids=[p[0] for p in RETURNS])
def test_return_values(fn):
    res = _capture(fn, r(3))
    x = r(3)
    actual, expected = res.function(x), fn(x)
    assert type(actual) is type(expected)
    if isinstance(expected, Holder):
        torch.testing.assert_close(actual.t, expected.t)
    elif dataclasses.is_dataclass(expected):
        torch.testing.assert_close(actual.x, expected.x)
        assert actual.tag == expected.tag
    else:
        assert repr(type(actual)) == repr(type(expected))
        torch.testing.assert_close(
            [v for v in _leaves(actual)], [v for v in _leaves(expected)], equal_nan=True
        )


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (int, float)):
        yield torch.tensor(float(x))


def test_input_returned_keeps_identity():
    x = r(3)
    res = _capture(lambda x: x, x)
    y = r(3)
    assert res.function(y) is y
    assert res.graphs == []


def test_same_tensor_output_once():
    res = _capture(lambda x: (x + 1,) * 2, r(3))
    (out_node,) = [n for n in res.graphs[0].graph.nodes if n.op == "output"]
    assert len(out_node.args[0]) == 1


def test_module_state_is_read_from_the_module_dicts(monkeypatch):
    """Parameters, buffers and submodules are reloaded by dict lookups: the output code never
    runs ``Module.__getattr__`` (hundreds of Python calls per call for a deep model)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    res = _capture(model.forward, r(2, 4))
    sources = {str(n.meta["source"]) for n in res.graphs[0].graph.nodes if n.op == "placeholder"}
    assert "L['self']._modules['0']._parameters['weight']" in sources
    assert "L['self']._modules['1']._buffers['running_mean']" in sources
    x = r(2, 4)
    expected = model(x)
    reads = []
    real = torch.nn.Module.__getattr__
    monkeypatch.setattr(torch.nn.Module, "__getattr__", lambda m, n: reads.append(n) or real(m, n))
    torch.testing.assert_close(res.function(x), expected)
    assert reads == []


def test_replaced_parameter_is_read_again():
    """The output code reads live module state: a parameter replaced through setattr (which
    lands in ``_parameters``) is the one the graph gets (guards decide whether it may run)."""
    model = torch.nn.Linear(4, 4)
    res = _capture(model.forward, r(2, 4))
    model.weight = torch.nn.Parameter(torch.randn(4, 4))
    with torch.no_grad():
        model.bias.add_(1.0)
    x = r(2, 4)
    torch.testing.assert_close(res.function(x), model(x))


def test_shared_paths_are_loaded_once():
    """``self._modules`` is read once and each layer's ``_parameters`` once, not per input."""
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
    res = _capture(model.forward, r(2, 4))
    attrs = [i.argval for i in dis.get_instructions(res.code) if i.opname == "LOAD_ATTR"]
    assert attrs.count("_modules") == 1 and attrs.count("_parameters") == 3
    x = r(2, 4)
    torch.testing.assert_close(res.function(x), model(x))
    model[1].weight = torch.nn.Parameter(torch.randn(4, 4))  # still read on every call
    torch.testing.assert_close(res.function(x), model(x))
