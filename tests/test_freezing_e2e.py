"""CPU inference freezing through kiln.compile: batch norm folded into convolutions, module
state computed with once, and every change of a weight seen (option ``freezing``); frozen
convolutions on prepacked oneDNN weights, called from the wrapper with their activation or
residual add fused, laid out channels-last; frozen linears of enough rows on prepacked weights."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

import kiln
from kiln import loopir
from kiln.autograd_aot import onednn_packing
from kiln.autograd_aot.freezing import FrozenForward
from kiln.capture import counters


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _bn(c):
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn


class Net(nn.Module):
    """Conv-BN-ReLU stem, a residual block and a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), _bn(8))
        self.c1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.b1 = _bn(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=4)
        self.b2 = _bn(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(x + self.b2(self.c2(y)))
        return self.head(x.mean((2, 3)))


def _frozen_programs():
    return counters.snapshot().get("autograd_aot", {}).get("frozen_programs", 0)


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_inference_is_frozen_and_matches_eager():
    m = Net().eval().requires_grad_(False)
    compiled = kiln.compile(m)
    with torch.no_grad():
        for batch in (2, 2, 2):
            x = torch.randn(batch, 3, 16, 16)
            _close(compiled(x), m(x))
    assert _frozen_programs() == 1


def test_by_default_parameters_requiring_grad_are_not_frozen():
    """A model whose parameters require grad may be in training between calls: the default
    freezes only models set up for inference alone."""
    m = Net().eval()
    with torch.no_grad():
        x = torch.randn(2, 3, 16, 16)
        _close(kiln.compile(m)(x), m(x))
    assert _frozen_programs() == 0


def test_changed_weights_give_the_new_answer():
    m, other = Net().eval(), Net().eval()
    compiled = kiln.compile(m, options={"freezing": True})
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        _close(compiled(x), m(x))
        assert _frozen_programs() == 1
        m.c1.weight.mul_(-1)
        m.b2.running_mean.add_(3)
        _close(compiled(x), m(x))
        m.load_state_dict(other.state_dict())
        _close(compiled(x), other(x))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(x).sum().backward()
    opt.step()
    with torch.no_grad():
        _close(compiled(x), m(x))


def test_training_and_grad_mode_are_not_frozen():
    m = Net()
    compiled = kiln.compile(m)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # train-mode batch norm writes its statistics
        _close(compiled(x), m(x))
    m.eval()
    out = compiled(x)  # grad mode, parameters requiring grad: a joint program
    _close(out, m(x))
    out.sum().backward()
    assert m.c1.weight.grad is not None
    assert _frozen_programs() == 0


def test_the_option_and_environment_turn_it_off(monkeypatch):
    m = Net().eval().requires_grad_(False)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        _close(kiln.compile(m, options={"freezing": False})(x), m(x))
        assert _frozen_programs() == 0
        monkeypatch.setenv("KILN_FREEZING", "0")
        kiln.reset()
        _close(kiln.compile(m)(x), m(x))
        assert _frozen_programs() == 0
        _close(kiln.compile(m, options={"freezing": True})(x), m(x))
        assert _frozen_programs() == 1
        monkeypatch.setenv("KILN_FREEZING", "1")  # also where parameters require grad
        kiln.reset()
        grad_model = Net().eval()
        _close(kiln.compile(grad_model)(x), grad_model(x))
        assert _frozen_programs() == 1


def test_stored_programs_hold_no_weights_and_see_changes():
    from torch import fx

    from kiln import loopir
    from kiln.autograd_aot.freezing import FrozenForward

    m = Net().eval().requires_grad_(False)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        data = loopir.save_fx(loopir.compile_fx(fx.symbolic_trace(m), [x]))
        loaded = loopir.load_fx(data, fx.symbolic_trace(m), [x])
        forward = loaded.variant(False).forward
        assert isinstance(forward, FrozenForward)
        assert forward._state is None  # constants computed on the first call, not stored
        _close(loaded(x), m(x))
        m.c1.weight.mul_(2)
        _close(loaded(x), m(x))


def test_a_graph_with_tensor_constants_is_frozen():
    """A tensor made in ``forward`` is an attribute of the traced graph; the frozen graphs keep
    it (GPT-2 builds such constants)."""

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return x @ (self.lin.weight * 2).t() * torch.tensor([2.0, 3.0, 4.0, 5.0])

    m = Scaled().eval().requires_grad_(False)
    compiled = kiln.compile(m, fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 4)
            _close(compiled(x), m(x))
    assert _frozen_programs() == 1
    assert kiln.stats().eager_fallbacks == 0


def test_inference_tensors_are_not_frozen():
    """Tensors made under ``inference_mode`` track no version, so a write to them could not be
    seen: a model built there is compiled without freezing, and writes are seen."""
    with torch.inference_mode():
        m = Net().eval()
        compiled = kiln.compile(m)
        x = torch.randn(2, 3, 16, 16)
        _close(compiled(x), m(x))
        m.c1.weight.mul_(2)
        _close(compiled(x), m(x))
    assert kiln.stats().eager_fallbacks == 0


_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


@pytest.fixture
def small_convolutions_packed(monkeypatch):
    """The tests' convolutions are small: packed whatever their size."""
    monkeypatch.setattr(onednn_packing, "MIN_MACS", 0)


class Block(nn.Module):
    """A ResNet basic block after a stem and max pool, a SiLU conv and a depthwise conv."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), _bn(8))
        self.c1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.b1 = _bn(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.b2 = _bn(8)
        self.c3 = nn.Conv2d(8, 16, 1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        y = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(x + self.b2(self.c2(y)))
        x = nn.functional.hardswish(self.dw(nn.functional.silu(self.c3(x))))
        return self.head(x.mean((2, 3)))


@_onednn
@pytest.mark.usefixtures("small_convolutions_packed")
def test_wrapper_calls_the_packed_convolutions_with_fused_post_ops():
    m = Block().eval().requires_grad_(False)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        compiled = loopir.compile_fx(fx.symbolic_trace(m), [x])
        for _ in range(3):
            x = torch.randn(2, 3, 32, 32)
            _close(compiled(x), m(x))
    forward = compiled.variant(False).forward
    assert isinstance(forward, FrozenForward)
    source = forward.compiled.source
    assert source.count("# extern mkldnn._convolution_pointwise.default") == 3
    assert source.count("# extern mkldnn._convolution_pointwise.binary") == 1
    assert source.count("# extern aten.convolution.default") == 1  # the depthwise one
    assert "'relu'" in source and "'swish'" in source and "'add', None, 'relu'" in source
    found = counters.snapshot()
    assert not found.get("fallback_ops") and not found.get("extern_copies")
    # channels-last: the max pool writes NHWC, so no convolution copies its input
    assert "empty_strided((2, 8, 8, 8), (512, 1, 64, 8)" in source


@_onednn
@pytest.mark.usefixtures("small_convolutions_packed")
def test_changed_weights_are_seen_by_packed_convolutions():
    m = Block().eval().requires_grad_(False)
    compiled = kiln.compile(m)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 3, 32, 32)
            _close(compiled(x), m(x))
        m.c1.weight.mul_(2)
        x = torch.randn(1, 3, 32, 32)
        _close(compiled(x), m(x))
        m.load_state_dict({k: v * 0.5 for k, v in m.state_dict().items()})
        x = torch.randn(1, 3, 32, 32)
        _close(compiled(x), m(x))
        m.c2.weight.data = torch.randn_like(m.c2.weight)
        x = torch.randn(1, 3, 32, 32)
        _close(compiled(x), m(x))
    assert counters.snapshot()["extern_kernels"]["mkldnn._convolution_pointwise.binary"] == 1


@_onednn
@pytest.mark.usefixtures("small_convolutions_packed")
def test_prepacking_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("KILN_FREEZING_PREPACK", "0")
    m = Block().eval().requires_grad_(False)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        compiled = loopir.compile_fx(fx.symbolic_trace(m), [x])
        _close(compiled(x), m(x))
    forward = compiled.variant(False).forward  # not frozen: only transposes to fold
    assert "mkldnn" not in getattr(forward, "compiled", forward).source


class Mlp(nn.Module):
    """A transformer's MLP block with a classifier head: linears on 3-D and 2-D inputs."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = x + self.down(torch.relu(self.up(x)))
        return self.head(nn.functional.gelu(x.mean(1)))


@_onednn
def test_wrapper_calls_the_packed_linears_with_enough_rows():
    """The two linears over batch x sequence rows are packed, ReLU fused; the head's 4 rows
    stay ATen's."""
    m = Mlp().eval().requires_grad_(False)
    with torch.no_grad():
        compiled = loopir.compile_fx(fx.symbolic_trace(m), [torch.randn(4, 8, 16)])
        for _ in range(3):
            x = torch.randn(4, 8, 16)
            _close(compiled(x), m(x))
    source = compiled.variant(False).forward.compiled.source
    assert sum("mkldnn._linear_pointwise.default" in line for line in source.splitlines()) == 2
    assert "'relu', _c" in source and "aten.addmm" in source
    found = counters.snapshot()  # a vendor kernel called on purpose, not a missing lowering
    assert found["extern_kernels"]["mkldnn._linear_pointwise.default"] == 2
    assert "mkldnn._linear_pointwise.default" not in found.get("fallback_ops", {})


@_onednn
def test_changed_weights_are_seen_by_packed_linears(monkeypatch):
    m = Mlp().eval().requires_grad_(False)
    compiled = kiln.compile(m)
    with torch.no_grad():
        for change in (
            lambda: m.up.weight.mul_(2),
            lambda: m.load_state_dict({k: v * 0.5 for k, v in m.state_dict().items()}),
            lambda: setattr(m.down.weight, "data", torch.randn_like(m.down.weight)),
            lambda: m.up.bias.add_(1),
        ):
            x = torch.randn(4, 8, 16)
            _close(compiled(x), m(x))
            change()
            x = torch.randn(4, 8, 16)
            _close(compiled(x), m(x))
        assert _frozen_programs() == 1
        monkeypatch.setenv("KILN_FREEZING_PREPACK", "0")
        compiled = loopir.compile_fx(fx.symbolic_trace(m), [x])
        _close(compiled(x), m(x))
    forward = compiled.variant(False).forward  # not frozen: only transposes to fold
    assert "mkldnn" not in getattr(forward, "compiled", forward).source
