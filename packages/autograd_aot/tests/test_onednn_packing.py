"""Frozen convolutions and linears on a prepacked oneDNN weight, with the op after them
fused: which ones are rewritten, results equal to eager's over several calls, and every change of
a weight seen (the packed weight is one of the constants)."""

import pytest
import torch
from freezing_testing import Recorder, batch_norm
from torch import fx, nn

from kiln.autograd_aot import aot_compile, default_decompositions, onednn_packing
from kiln.autograd_aot.freezing import FrozenForward

aten = torch.ops.aten

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


@pytest.fixture(autouse=True)
def _small_convolutions_too(monkeypatch):
    """The tests' convolutions are small: packed whatever their size, except where a test
    restores the threshold."""
    monkeypatch.setattr(onednn_packing, "MIN_MACS", 0)


def _mkldnn():
    return torch.ops.mkldnn


class ConvAct(nn.Module):
    def __init__(self, act, groups=1, cin=8, cout=8):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, groups=groups)
        self.bn = batch_norm(cout)
        self.act = act

    def forward(self, x):
        return self.act(self.bn(self.conv(x))).sum(dim=1)  # the convolution is not returned


class Residual(nn.Module):
    def __init__(self, relu=True):
        super().__init__()
        self.c1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.b1 = batch_norm(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.b2 = batch_norm(8)
        self.relu = relu

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = x + self.b2(self.c2(y))
        return (torch.relu(y) if self.relu else y).mean((2, 3))


def _table():
    """The default table with batch norm decomposed and the activations kept, as loopir's."""
    table = default_decompositions()
    table.update(torch._decomp.get_decompositions([aten.native_batch_norm]))
    for op in (aten.hardswish, aten.hardsigmoid, aten.silu, aten.gelu, aten.hardtanh):
        for name in op.overloads():
            table.pop(getattr(op, name), None)
    return table


def _compile(module, shape, table=_table):
    rec = Recorder()
    with torch.no_grad():
        compiled = aot_compile(
            fx.symbolic_trace(module),
            [torch.randn(shape)],
            fw_compiler=rec,
            decompositions=table(),
            freezing=True,
        )
    return compiled, rec.graphs[0]


def _check(module, compiled, shape, calls=3):
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-4)


def _calls(gm):
    return [
        (n.target, [a for a in n.args if not isinstance(a, fx.Node)])
        for n in gm.graph.nodes
        if n.op == "call_function"
    ]


@pytest.mark.parametrize(
    ("act", "attr", "scalars", "algorithm"),
    [
        (nn.ReLU(), "relu", [], ""),
        (nn.ReLU6(), "hardtanh", [0.0, 6.0], ""),
        (nn.Hardtanh(-0.5, 2.0), "hardtanh", [-0.5, 2.0], ""),
        (nn.Hardswish(), "hardswish", [], ""),
        (nn.Hardsigmoid(), "hardsigmoid", [], ""),
        (nn.SiLU(), "swish", [], ""),
        (nn.GELU(), "gelu", [], "none"),
        (nn.GELU("tanh"), "gelu", [], "tanh"),
        (nn.Sigmoid(), "sigmoid", [], ""),
        (nn.LeakyReLU(0.2), "leaky_relu", [0.2], ""),
    ],
)
def test_activation_is_fused_as_a_post_op(act, attr, scalars, algorithm):
    m = ConvAct(act).eval()
    compiled, gm = _compile(m, (2, 8, 9, 9))
    _check(m, compiled, (2, 8, 9, 9))
    (conv, rest) = _calls(gm)
    assert conv[0] is _mkldnn()._convolution_pointwise.default
    assert conv[1][-3:] == [attr, scalars, algorithm]
    assert rest[0] is aten.sum.dim_IntList  # the activation ran inside the convolution
    forward = compiled.variant(False).forward
    assert isinstance(forward, FrozenForward)
    packed = forward.constants(*[p for p in m.parameters()] + [b for b in m.buffers()])
    assert any(t.is_mkldnn for t in packed)  # the packed weight is a constant


def test_residual_add_and_relu_are_the_binary_post_op():
    m = Residual().eval()
    compiled, gm = _compile(m, (2, 8, 9, 9))
    _check(m, compiled, (2, 8, 9, 9))
    calls = _calls(gm)
    assert [c[0] for c in calls[:2]] == [
        _mkldnn()._convolution_pointwise.default,
        _mkldnn()._convolution_pointwise.binary,
    ]
    assert calls[1][1][4:7] == ["add", None, "relu"]
    assert aten.add.Tensor not in [c[0] for c in calls]


def test_residual_add_without_relu():
    m = Residual(relu=False).eval()
    compiled, gm = _compile(m, (1, 8, 9, 9))
    _check(m, compiled, (1, 8, 9, 9))
    binary = [c for c in _calls(gm) if c[0] is _mkldnn()._convolution_pointwise.binary]
    assert binary[0][1][4:7] == ["add", None, None]


@pytest.mark.parametrize("act", [nn.Mish(), nn.ELU()])
def test_other_ops_stay_after_the_packed_convolution(act):
    m = ConvAct(act).eval()
    compiled, gm = _compile(m, (2, 8, 9, 9))
    _check(m, compiled, (2, 8, 9, 9))
    calls = _calls(gm)
    assert calls[0][0] is _mkldnn()._convolution_pointwise.default
    assert calls[0][1][-3:] == ["none", [], ""]


def test_grouped_returned_and_switched_off_convolutions_stay_aten(monkeypatch):
    for module in (ConvAct(nn.ReLU(), groups=8), ConvAct(nn.ReLU(), groups=2)):
        compiled, gm = _compile(module.eval(), (1, 8, 9, 9))
        _check(module, compiled, (1, 8, 9, 9))
        assert _calls(gm)[0][0] is aten.convolution.default
    returned = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), batch_norm(8), nn.ReLU()).eval()
    compiled, gm = _compile(returned, (1, 8, 9, 9))
    _check(returned, compiled, (1, 8, 9, 9))
    assert _calls(gm)[0][0] is aten.convolution.default  # eager's NCHW result kept
    m = ConvAct(nn.ReLU()).eval()
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False  # (flags() would also set TF32, with a warning)
    try:
        compiled, gm = _compile(m, (1, 8, 9, 9))
    finally:
        torch.backends.mkldnn.enabled = was
    assert _calls(gm)[0][0] is aten.convolution.default
    monkeypatch.setenv("KILN_FREEZING_PREPACK", "0")
    compiled, gm = _compile(m, (1, 8, 9, 9))
    assert _calls(gm)[0][0] is aten.convolution.default


def test_weight_changes_are_seen_through_the_packed_weight():
    m = Residual().eval()
    compiled, _ = _compile(m, (2, 8, 9, 9))
    _check(m, compiled, (2, 8, 9, 9), calls=2)
    with torch.no_grad():
        m.c1.weight.mul_(2)
    _check(m, compiled, (2, 8, 9, 9), calls=2)
    state = {k: v * 0.5 if v.is_floating_point() else v for k, v in m.state_dict().items()}
    m.load_state_dict(state)
    _check(m, compiled, (2, 8, 9, 9), calls=2)
    m.c2.weight.data = torch.randn_like(m.c2.weight)
    _check(m, compiled, (2, 8, 9, 9), calls=2)
    with torch.no_grad():
        m.b2.running_var.mul_(3)  # folded into the packed weight first
    _check(m, compiled, (2, 8, 9, 9), calls=2)


def test_channels_last_input():
    m = Residual().eval()
    x = torch.randn(2, 8, 9, 9).contiguous(memory_format=torch.channels_last)
    compiled, _ = _compile(m, (2, 8, 9, 9))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)


def test_small_convolutions_stay_aten(monkeypatch):
    """Below MIN_MACS oneDNN's fixed cost per call outweighs the packing (a squeeze-excitation
    convolution on 1x1 positions); a 3x3 convolution of 64 channels on 32x32 packs."""
    monkeypatch.setattr(onednn_packing, "MIN_MACS", 1 << 22)
    se = ConvAct(nn.ReLU(), cin=64, cout=64)
    compiled, gm = _compile(se.eval(), (1, 64, 1, 1))
    _check(se, compiled, (1, 64, 1, 1))
    assert _calls(gm)[0][0] is aten.convolution.default
    compiled, gm = _compile(se, (1, 64, 32, 32))
    assert _calls(gm)[0][0] is _mkldnn()._convolution_pointwise.default


class Mlp(nn.Module):
    """Linear, activation, linear without bias: a transformer's MLP block."""

    def __init__(self, act, width=16, hidden=32):
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.act = act
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


def _linear_calls(gm):
    return [c for c in _calls(gm) if c[0] is _mkldnn()._linear_pointwise.default]


@pytest.mark.parametrize("table", [_table, default_decompositions])
@pytest.mark.parametrize("shape", [(12, 16), (2, 6, 16)])
def test_linears_with_enough_rows_are_packed(table, shape):
    """``addmm`` (kept) or ``mm``, ``* 1``, ``+ bias`` (the core table's), on 2-D or 3-D
    input (a ``view`` between the product and the activation)."""
    m = Mlp(nn.ReLU()).eval()
    compiled, graph = _compile(m, shape, table)
    _check(m, compiled, shape)
    up, down = _linear_calls(graph)
    assert up[1] == ["relu", [], ""] and down[1] == [None, "none", [], ""]
    targets = [c[0] for c in _calls(graph)]
    assert aten.relu.default not in targets and aten.mm.default not in targets
    assert aten.addmm.default not in targets


@pytest.mark.parametrize(
    ("act", "attr", "scalars", "algorithm"),
    [
        (nn.ReLU(), "relu", [], ""),
        (nn.ReLU6(), "hardtanh", [0.0, 6.0], ""),
        (nn.LeakyReLU(0.2), "leaky_relu", [0.2], ""),
        (nn.GELU(), "none", [], ""),  # oneDNN's post-op is slower than the op after it
        (nn.SiLU(), "none", [], ""),
        (nn.Tanh(), "none", [], ""),
    ],
)
def test_linear_activation_is_fused_as_a_post_op(act, attr, scalars, algorithm):
    m = Mlp(act).eval()
    compiled, gm = _compile(m, (2, 6, 16))
    _check(m, compiled, (2, 6, 16))
    assert _linear_calls(gm)[0][1][-3:] == [attr, scalars, algorithm]


def test_one_row_and_switched_off_linears_stay_aten(monkeypatch):
    m = Mlp(nn.ReLU()).eval()
    compiled, gm = _compile(m, (1, 16))
    _check(m, compiled, (1, 16))
    assert not _linear_calls(gm)
    assert aten.mm.default in [c[0] for c in _calls(gm)]
    monkeypatch.setattr(onednn_packing, "MIN_LINEAR_ROWS", 1)
    compiled, gm = _compile(m, (1, 16))
    _check(m, compiled, (1, 16))
    assert len(_linear_calls(gm)) == 2
    monkeypatch.setenv("KILN_FREEZING_PREPACK", "0")
    _, gm = _compile(m, (12, 16))
    assert not _linear_calls(gm)


def test_an_empty_weight_stays_aten():
    """oneDNN has no primitive for a product over 0 inputs (ATen answers the bias)."""
    m = nn.Sequential(nn.Linear(0, 8), nn.ReLU()).eval()
    compiled, gm = _compile(m, (12, 0))
    _check(m, compiled, (12, 0))
    assert not _linear_calls(gm)


def test_products_by_a_weight_not_transposed_and_returned_linears():
    """``x @ w`` with ``w`` stored (in, out), a weight computed from state, and a linear
    whose result the graph returns as well as reads."""

    class Products(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(16, 24))
            self.lin = nn.Linear(16, 16)

        def forward(self, x):
            y = self.lin(x)
            z = torch.relu(x @ (self.w * 2)) + (y @ self.w).sum()
            return y, z

    m = Products().eval()
    compiled, gm = _compile(m, (12, 16))
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(12, 16)
            for a, b in zip(compiled(x), m(x), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len(_linear_calls(gm)) == 3


def test_weight_changes_are_seen_through_the_packed_linear_weight():
    m = Mlp(nn.GELU()).eval()
    compiled, _ = _compile(m, (2, 6, 16))
    _check(m, compiled, (2, 6, 16), calls=2)
    with torch.no_grad():
        m.up.weight.mul_(2)
    _check(m, compiled, (2, 6, 16), calls=2)
    m.load_state_dict({k: v * 0.5 for k, v in m.state_dict().items()})
    _check(m, compiled, (2, 6, 16), calls=2)
    m.down.weight.data = torch.randn_like(m.down.weight)
    _check(m, compiled, (2, 6, 16), calls=2)
    with torch.no_grad():
        m.up.bias.add_(1)
    _check(m, compiled, (2, 6, 16), calls=2)
