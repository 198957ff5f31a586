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
