"""Round trip of PyTorch-style code (the frames the evaluator will rewrite), against eager."""

import importlib.util
from pathlib import Path

import torch

from kiln.capture.breaks.resume import make_resume
from kiln.capture.bytecode import decode

_spec = importlib.util.spec_from_file_location(
    "tools", Path(__file__).with_name("bytecode_corpus_tools.py")
)
_tools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tools)


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x, *, scale=1.0):
        h = self.norm(x)
        with torch.no_grad():
            gate = torch.sigmoid(h.mean(dim=-1, keepdim=True))
        for _ in range(2):
            h = torch.relu(self.lin(h)) * gate
        return x + scale * h if x.shape[-1] > 2 else x


def inplace_and_views(x, y):
    z = x.clone()
    z.add_(y)
    z[0] = y.sum()
    parts = torch.chunk(z, 2, dim=0)
    return torch.cat([p * (i + 1) for i, p in enumerate(parts)]), z.view(-1).shape


def test_module_forward_round_trip():
    torch.manual_seed(0)
    block = Block(8)
    x = torch.randn(4, 8)
    forward = _tools.roundtrip(Block.forward)
    torch.testing.assert_close(forward(block, x, scale=0.5), block(x, scale=0.5))


def test_tensor_function_round_trip():
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    got = _tools.roundtrip(inplace_and_views)(x, y)
    want = inplace_and_views(x, y)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]


def test_resume_after_a_tensor_op():
    # break after the norm, as a graph break would: h is on the stack, x and self are live
    torch.manual_seed(1)
    block = Block(8)
    x = torch.randn(4, 8)
    body = decode(Block.forward.__code__)
    store_h = next(i for i in body.instrs if i.opname == "STORE_FAST" and i.arg == "h")
    r = make_resume(Block.forward.__code__, store_h.offset, 1)
    # gate counts as live: were an exception in the with block suppressed, it would be read unbound
    assert set(r.locals) == {"self", "x", "scale", "gate"}
    r = make_resume(Block.forward.__code__, store_h.offset, 1, live=("self", "x", "scale"))
    args = {"self": block, "x": x, "scale": 0.5}
    assert r.closure == ()
    resumed = r.make_function(Block.forward.__globals__)
    got = resumed(block.norm(x), *(args[n] for n in r.locals))
    torch.testing.assert_close(got, block(x, scale=0.5))


def _break_harness():
    spec = importlib.util.spec_from_file_location(
        "stack", Path(__file__).with_name("test_resume_stack.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_graph_breaks_anywhere_in_a_module_forward():
    harness = _break_harness()
    torch.manual_seed(2)
    block = Block(6)
    x = torch.randn(3, 6)
    want = block(x, scale=0.25)
    points = harness.break_points(Block.forward.__code__)
    for i in points[:: max(1, len(points) // 12)]:
        broken = harness.break_at(Block.forward, i)
        for _ in range(3):
            torch.testing.assert_close(broken(block, x, scale=0.25), want)
