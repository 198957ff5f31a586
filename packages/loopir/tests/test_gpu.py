"""The reference backend on CUDA tensors (skipped without a GPU)."""

import pytest
import torch
from loopir_testing import aten_graph

from kiln.loopir import ReferenceBackend, compile_graph

aten = torch.ops.aten
pytestmark = pytest.mark.gpu


def _fake_like(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def test_cuda_softmax_layer_norm_and_random():
    x, w, b = (torch.randn(*s, device="cuda") for s in ((8, 32), (32,), (32,)))

    def fn(x, w, b):
        ln = aten.native_layer_norm.default(x, [32], w, b, 1e-5)
        return (aten._softmax.default(x, -1, False), ln[0], aten.rand_like.default(x))

    gm = aten_graph(fn, x, w, b)
    for node in gm.graph.nodes:  # meta values carry the real device, as fake tensors do
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            node.meta["val"] = torch.empty_strided(
                val.shape, val.stride(), dtype=val.dtype, device="cuda"
            )
    compiled = compile_graph(gm, [x, w, b], backend=ReferenceBackend())
    torch.manual_seed(1)
    out = compiled(x, w, b)
    expected = fn(x, w, b)
    torch.testing.assert_close(out[0], expected[0])
    torch.testing.assert_close(out[1], expected[1], atol=1e-5, rtol=1e-5)
    assert out[2].device.type == "cuda"
    torch.manual_seed(1)
    again = compiled(x, w, b)[2]
    torch.testing.assert_close(out[2], again)
    # the same seed gives the same numbers on CPU: random bits are device independent
    gm_cpu = aten_graph(lambda x: (aten.rand_like.default(x),), x.cpu())
    cpu = compile_graph(gm_cpu, [_fake_like(x)], backend=ReferenceBackend())
    torch.manual_seed(1)
    torch.testing.assert_close(cpu(x.cpu())[0], out[2].cpu())
