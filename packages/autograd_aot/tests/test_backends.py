"""The two eager AOT backends."""

import torch
from torch import fx

from kiln.autograd_aot import aot_eager, aot_eager_decomp_partition


def _targets(compiled):
    fw = compiled.variant(joint=True).forward
    return {n.target for n in fw.graph.nodes if n.op == "call_function"}


def test_aot_eager_keeps_fused_ops_and_saves_all():
    x = torch.randn(3, 4, requires_grad=True)
    compiled = aot_eager(fx.symbolic_trace(lambda x: torch.softmax(x, -1)), [x])
    assert torch.ops.aten._softmax.default in _targets(compiled)
    stats = compiled.partition_stats
    assert stats.saved_bytes == stats.save_all_bytes


def test_decomp_partition_decomposes():
    x = torch.randn(3, 4, requires_grad=True)
    compiled = aot_eager_decomp_partition(fx.symbolic_trace(lambda x: torch.softmax(x, -1)), [x])
    targets = _targets(compiled)
    assert torch.ops.aten._softmax.default not in targets
    assert torch.ops.aten.exp.default in targets
    torch.testing.assert_close(compiled(x), torch.softmax(x, -1))
