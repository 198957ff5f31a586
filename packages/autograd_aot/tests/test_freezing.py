"""Freezing: forward-only programs take module state as constants, batch norm folded into the
convolution before it, and a changed weight is always seen."""

import pytest
import torch
from freezing_testing import Recorder
from torch import fx, nn

from kiln.autograd_aot import aot_compile, default_decompositions
from kiln.autograd_aot.freezing import FrozenForward
from kiln.capture import counters

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _plain_convolutions(monkeypatch):
    """The folds as ATen convolutions: oneDNN prepacking has its own tests
    (test_onednn_packing.py)."""
    monkeypatch.setenv("KILN_FREEZING_PREPACK", "0")


class ConvBN(nn.Module):
    def __init__(self, cin=4, cout=6, groups=1, bias=True, act=True):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, groups=groups, bias=bias)
        self.bn = nn.BatchNorm2d(cout)
        self.act = act
        with torch.no_grad():  # statistics of a trained net, not the identity
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return torch.relu(y) if self.act else y


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _table():
    """The default table with batch norm decomposed, as loopir's is."""
    table = default_decompositions()
    table.update(torch._decomp.get_decompositions([aten.native_batch_norm]))
    return table


def _compile(module, x, freezing=True):
    rec = Recorder()
    gm = fx.symbolic_trace(module)
    compiled = aot_compile(gm, [x], fw_compiler=rec, decompositions=_table(), freezing=freezing)
    return compiled, rec


def _check(module, compiled, shape, calls=3):
    for _ in range(calls):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("groups", "bias", "act"),
    [(1, True, True), (1, False, True), (2, True, False), (6, False, True)],
)
def test_batch_norm_folds_into_the_convolution(groups, bias, act):
    m = ConvBN(6, 6, groups=groups, bias=bias, act=act).eval()
    with torch.no_grad():
        compiled, rec = _compile(m, torch.randn(2, 6, 8, 8))
        _check(m, compiled, (2, 6, 8, 8))
    (gm,) = rec.graphs
    expected = [aten.convolution.default] + ([aten.relu.default] if act else [])
    assert _ops(gm) == expected  # batch norm's arithmetic is gone
    forward = compiled.variant(False).forward
    assert isinstance(forward, FrozenForward)
    # the folded weight and bias (no other state reaches the runtime graph)
    assert len(forward.constants.graph.find_nodes(op="output")[0].args[0]) == 2


def _frozen(m, shape):
    with torch.no_grad():
        compiled, _ = _compile(m, torch.randn(shape))
    assert isinstance(compiled.variant(False).forward, FrozenForward)
    return compiled


def test_weights_changed_in_place_are_seen():
    m = ConvBN().eval()
    compiled = _frozen(m, (1, 4, 5, 5))
    x = torch.randn(1, 4, 5, 5)
    with torch.no_grad():
        before = compiled(x)
        m.conv.weight.mul_(2)
        m.bn.running_var.add_(1)
        after = compiled(x)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, m(x), rtol=1e-4, atol=1e-5)


def test_load_state_dict_and_data_assignment_are_seen():
    m, other = ConvBN().eval(), ConvBN().eval()
    compiled = _frozen(m, (1, 4, 5, 5))
    with torch.no_grad():
        x = torch.randn(1, 4, 5, 5)
        compiled(x)
        m.load_state_dict(other.state_dict())
        torch.testing.assert_close(compiled(x), other(x), rtol=1e-4, atol=1e-5)
        m.bn.weight.data = torch.randn(6)  # same object, new storage, same version
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-5)


def test_optimizer_step_is_seen():
    m = ConvBN().eval()
    compiled = _frozen(m, (1, 4, 5, 5))
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    x = torch.randn(1, 4, 5, 5)
    m(x).sum().backward()
    opt.step()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-5)


def test_training_mode_is_not_frozen():
    """Train-mode batch norm writes its statistics: the program writes inputs, never frozen."""
    m = ConvBN().train()
    with torch.no_grad():
        compiled, rec = _compile(m, torch.randn(2, 4, 5, 5))
    assert not isinstance(compiled.variant(False).forward, FrozenForward)
    assert len(_ops(rec.graphs[0])) > 2


def test_grad_mode_and_inputs_requiring_grad_are_not_frozen():
    m = ConvBN().eval()
    compiled, _ = _compile(m, torch.randn(1, 4, 5, 5))  # grad enabled, parameters need grad
    x = torch.randn(1, 4, 5, 5, requires_grad=True)
    compiled(x).sum().backward()
    assert all(not isinstance(p.forward, FrozenForward) for p in compiled.variants())
    assert m.conv.weight.grad is not None


def test_off_without_the_flag_and_without_state():
    m = ConvBN().eval()
    with torch.no_grad():
        compiled, _ = _compile(m, torch.randn(1, 4, 5, 5), freezing=False)
        assert not isinstance(compiled.variant(False).forward, FrozenForward)
        gm = fx.symbolic_trace(lambda x, w: torch.relu(x * w.exp()))
        plain = aot_compile(
            gm, [torch.randn(3), torch.randn(3)], fw_compiler=Recorder(), freezing=True
        )
        assert not isinstance(plain.variant(False).forward, FrozenForward)


class _ReturnsState(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        scaled = self.w * 2  # returned (and viewed): computed per call, exp(scaled) once
        return x + self.w.exp(), scaled, scaled[:2]


def test_outputs_are_never_cached_tensors():
    m = _ReturnsState()
    compiled = _frozen(m, (3,))
    with torch.no_grad():
        x = torch.randn(3)
        first = compiled(x)
        first[1].add_(100)  # the caller owns what it got
        second = compiled(x)
        for got, want in zip(second, m(x), strict=True):
            torch.testing.assert_close(got, want)
        assert first[1].data_ptr() != second[1].data_ptr()


class _Block(nn.Module):
    """A timm-like inverted residual: 1x1 expand, depthwise, squeeze-excite, 1x1 project."""

    def __init__(self, c=8, e=16):
        super().__init__()
        self.expand = ConvBN(c, e, act=True)
        self.dw = nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False)
        self.bn = nn.BatchNorm2d(e)
        self.se_reduce = nn.Conv2d(e, 4, 1)
        self.se_expand = nn.Conv2d(4, e, 1)
        self.project = nn.Conv2d(e, c, 1, bias=False)
        self.bn_out = nn.BatchNorm2d(c)
        with torch.no_grad():
            for bn in (self.bn, self.bn_out):
                bn.running_mean.uniform_(-1, 1)
                bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = self.expand(x)
        y = nn.functional.silu(self.bn(self.dw(y)))
        s = y.mean((2, 3), keepdim=True)
        y = y * torch.sigmoid(self.se_expand(torch.relu(self.se_reduce(s))))
        return x + self.bn_out(self.project(y))


def test_timm_like_block():
    m = _Block().eval()
    counters.clear()
    with torch.no_grad():
        compiled, rec = _compile(m, torch.randn(2, 8, 6, 6))
        _check(m, compiled, (2, 8, 6, 6))
    assert counters.snapshot()["autograd_aot"]["frozen_programs"] == 1
    ops = _ops(rec.graphs[0])
    assert ops.count(aten.convolution.default) == 5
    assert aten.rsqrt.default not in ops and aten.sub.Tensor not in ops
