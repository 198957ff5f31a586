"""Frozen CPU programs through loopir: convolutions on prepacked oneDNN weights, called from the
wrapper with their activation or residual add fused, laid out channels-last, equal to eager
over several calls and seeing every change of a weight."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

import kiln
from kiln import loopir
from kiln.autograd_aot import onednn_packing
from kiln.autograd_aot.freezing import FrozenForward
from kiln.capture import counters

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


@pytest.fixture(autouse=True)
def _small_convolutions_too(monkeypatch):
    """The tests' convolutions are small: packed whatever their size, except where a test
    restores the threshold."""
    monkeypatch.setattr(onednn_packing, "MIN_MACS", 0)


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


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


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


def test_changed_weights_are_seen_through_kiln_compile():
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


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("KILN_FREEZING_PREPACK", "0")
    m = Block().eval().requires_grad_(False)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        compiled = loopir.compile_fx(fx.symbolic_trace(m), [x])
        _close(compiled(x), m(x))
    assert "mkldnn" not in compiled.variant(False).forward.compiled.source
