"""export(): one graph, pytree specs, lifted parameters and buffers, equal to eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kiln.capture import ExportResult, Unsupported, export


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x, extra=None):
        y = self.bn(self.lin(x))
        if extra is not None:
            y = y + extra["bias"]
        return {"out": y, "pair": (y.sum(), 2)}


def test_export_module_lifts_parameters_and_buffers():
    m = Net().eval()
    x = torch.randn(5, 4)
    ep = export(m, x)
    assert isinstance(ep, ExportResult)
    assert list(ep.parameters) == ["lin.weight", "lin.bias", "bn.weight", "bn.bias"]
    assert list(ep.buffers) == ["bn.running_mean", "bn.running_var"]
    names = [n.name for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    assert len(names) == 7
    torch.testing.assert_close(ep(x), m(x))


def test_export_with_nested_inputs():
    m = Net().eval()
    x, bias = torch.randn(5, 4), torch.randn(3)
    ep = export(m, x, extra={"bias": bias})
    x2, bias2 = torch.randn(5, 4), torch.randn(3)
    torch.testing.assert_close(ep(x2, extra={"bias": bias2}), m(x2, extra={"bias": bias2}))


def test_export_function_and_unused_input():
    def fn(a, b, scale):
        return a * scale

    ep = export(fn, torch.randn(3), torch.randn(3), 2.0)
    a = torch.randn(3)
    torch.testing.assert_close(ep(a, torch.randn(3), 2.0), a * 2.0)
    assert any(str(g.source) == "L['scale']" for g in ep.guards)


def test_export_refuses_data_dependent_branch():
    def fn(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(Unsupported) as info:
        export(fn, torch.randn(3))
    assert info.value.kind == "data_dependent_branch"
    assert info.value.frame is not None and "x.sum() > 0" in info.value.frame.source


def test_export_runs_with_only_capture():
    ep = export(lambda x: torch.relu(x) + 1, torch.randn(4))
    code = ep.graph_module.code
    assert "relu" in code


def test_export_aliased_inputs_and_tied_weights():
    def fn(a, b):
        return a * 2 + b

    x = torch.randn(3)
    ep = export(fn, x, x)
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(ep(a, b), fn(a, b))

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(3, 3, bias=False)
            self.dec = nn.Linear(3, 3, bias=False)
            self.dec.weight = self.enc.weight

        def forward(self, x):
            return self.dec(self.enc(x))

    m = Tied()
    ep2 = export(m, torch.randn(2, 3))
    assert set(ep2.parameters) == {"enc.weight", "dec.weight"}
    x2 = torch.randn(2, 3)
    torch.testing.assert_close(ep2(x2), m(x2))


def test_export_varargs_and_kwargs_leaves():
    def fn(x, *rest, **extra):
        return x + rest[0] * extra["k"]

    a, b, c = torch.randn(2), torch.randn(2), torch.randn(2)
    ep = export(fn, a, b, k=c)
    a2, b2, c2 = torch.randn(2), torch.randn(2), torch.randn(2)
    torch.testing.assert_close(ep(a2, b2, k=c2), fn(a2, b2, k=c2))


def _head(x, y):
    return torch.nn.functional.relu(x @ torch.ones(8, 4)).sum(-1) + y[: x.shape[0]]


def test_export_with_dynamic_shapes_runs_at_other_sizes():
    from kiln.capture import Dim

    exported = export(
        _head, torch.randn(5, 8), torch.randn(10), dynamic_shapes=({0: Dim("b", 2, 64)}, None)
    )
    assert exported.dynamic_dims == {"L['x']": {0: (2, 64)}}
    assert "sym_size" in exported.graph_module.code
    for b in (3, 7, 9):
        x, y = torch.randn(b, 8), torch.randn(10)
        torch.testing.assert_close(exported(x, y), _head(x, y))
    shape = [g for g in exported.guards if g.kind.value == "shape"]
    relations = {str(g.expr) for g in shape[0].expected.guards}
    assert {"s0 >= 2", "s0 <= 10"} <= relations  # y[:b] assumed b <= 10, tighter than 64


def test_export_dynamic_shapes_by_name_and_per_dim_sequence():
    exported = export(_head, torch.randn(5, 8), torch.randn(10), dynamic_shapes={"x": [True, None]})
    assert exported.dynamic_dims == {"L['x']": {0: (None, None)}}


def _with_sizes(x):
    return x * 2, x.shape[0], {"rows": x.shape[0] * 3 + 1}


def test_export_returns_dynamic_sizes_as_graph_values():
    # read as constants, the sizes returned would be the example's at every size
    exported = export(_with_sizes, torch.randn(5, 3), dynamic_shapes=({0: True},))
    for rows in (2, 7, 11):
        x = torch.randn(rows, 3)
        got, want = exported(x), _with_sizes(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:]


def _returns_a_size_it_fixes(x):
    return x * 2, str(x.shape[0])  # a string of the size: the size is fixed


def test_export_refuses_a_dynamic_dim_the_result_fixes():
    from kiln.capture import DynamicShapesError

    with pytest.raises(DynamicShapesError, match="marked dynamic"):
        export(_returns_a_size_it_fixes, torch.randn(8, 4), dynamic_shapes=({0: True},))


def _needs_eight(x):
    return x.view(8, -1) if x.shape[0] == 8 else x


def test_export_refuses_a_dynamic_dim_the_program_fixes():
    from kiln.capture import DynamicShapesError

    with pytest.raises(DynamicShapesError, match=r"L\['x'\].size\(\)\[0\] was marked dynamic.*8"):
        export(_needs_eight, torch.randn(8, 4), dynamic_shapes=({0: True},))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (({5: True},), "no dimension 5"),
        (([True],), "has 2 dims, its spec 1"),
        ({"z": {0: True}}, "no argument 'z'"),
        (({0: 3},), "a dimension's spec is"),
        ("x", "must be a tuple, list or dict"),
    ],
)
def test_export_dynamic_shapes_spec_errors(spec, message):
    from kiln.capture import DynamicShapesError

    with pytest.raises(DynamicShapesError, match=message):
        export(_needs_eight, torch.randn(8, 4), dynamic_shapes=spec)


def test_export_dynamic_shapes_by_name_through_a_wrapping_decorator():
    """A decorated forward (``functools.wraps`` over ``*args, **kwargs``): the spec names the
    wrapped parameters, which live in the wrapper's ``args`` and ``kwargs``."""
    import functools

    from kiln.capture import Dim

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs)

        return wrapper

    @decorate
    def f(x, y):
        return x * 2 + y

    spec = {"x": {0: Dim("n", max=64)}, "y": {0: Dim("n", max=64)}}
    exported = export(f, torch.randn(5, 3), y=torch.randn(5, 3), dynamic_shapes=spec)
    assert set(exported.dynamic_dims) == {"L['args'][0]", "L['kwargs']['y']"}
    vals = [n.meta["val"] for n in exported.graph_module.graph.nodes if n.op == "placeholder"]
    assert all(isinstance(v.shape[0], torch.SymInt) for v in vals)
    x, y = torch.randn(9, 3), torch.randn(9, 3)
    torch.testing.assert_close(exported(x, y=y), f(x, y=y))
