"""End to end with Kiln's own capture: its graphs (parameters lifted, buffer mutations) compile."""

import copy

import pytest
import torch
from torch import nn

from kiln.autograd_aot import aot_eager_decomp_partition

capture = pytest.importorskip("kiln.capture").__dict__.get("capture")


@pytest.mark.skipif(capture is None, reason="kiln.capture.capture is not available")
def test_captured_training_step_matches_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 2))
    reference = copy.deepcopy(model)

    def step(model, x):
        y = model(x)
        y.add_(1)
        return y.sum(), y.t()

    x = torch.randn(5, 4, requires_grad=True)
    result = capture(
        step,
        (model, x),
        {},
        compile_graph=aot_eager_decomp_partition,
        wrap_callable=lambda f: f,
    )
    got = result.function(model, x)
    got[0].backward()
    grad_x, x.grad = x.grad, None
    expect = step(reference, x)
    expect[0].backward()
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(grad_x, x.grad)
    torch.testing.assert_close(dict(model.named_buffers()), dict(reference.named_buffers()))
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
