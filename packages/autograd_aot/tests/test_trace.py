"""The ATen tracer: node metadata, decompositions to a fixed point, constants, errors."""

import pytest
import torch

from kiln.autograd_aot import AotError, default_decompositions, trace_aten
from kiln.capture.meta import DataDependentOp, is_fake

aten = torch.ops.aten


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_every_node_has_fake_val():
    gm = trace_aten(lambda x, y: (x @ y).relu().sum(0), [torch.randn(3, 4), torch.randn(4, 5)], {})
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "call_function"):
            assert is_fake(node.meta["val"])
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    assert out.meta["val"].shape == (5,)
    assert out.meta["val"].device == torch.device("cpu")


def test_graph_matches_eager():
    x, y = torch.randn(3, 4), torch.randn(4, 5)
    fn = lambda x, y: torch.softmax(x @ y, -1) * 2  # noqa: E731
    gm = trace_aten(fn, [x, y], default_decompositions())
    torch.testing.assert_close(gm(x, y)[0], fn(x, y))


def test_decompositions_reach_fixed_point():
    table = default_decompositions()
    fn = lambda x: torch.nn.functional.layer_norm(torch.softmax(x, -1), (4,))  # noqa: E731
    gm = trace_aten(fn, [torch.randn(3, 4)], table)
    assert not [t for t in _targets(gm) if t in table]
    assert aten._softmax.default not in _targets(gm)
    assert aten.native_layer_norm.default not in _targets(gm)


def test_empty_table_keeps_fused_ops():
    gm = trace_aten(lambda x: torch.softmax(x, -1), [torch.randn(3, 4)], {})
    assert _targets(gm) == [aten._softmax.default]


def test_constants_become_attributes():
    c = torch.randn(4)
    gm = trace_aten(lambda x: x + c, [torch.randn(3, 4)], {})
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x)[0], x + c)


def test_data_dependent_op_raises():
    with pytest.raises(DataDependentOp):
        trace_aten(lambda x: x.nonzero(), [torch.randn(4)], {})


def test_foreign_fake_is_rejected():
    from kiln.capture.meta import to_fake

    stray = to_fake(torch.randn(3))
    with pytest.raises(AotError, match="outside this trace"):
        trace_aten(lambda x: x + stray, [torch.randn(3)], {})


def test_a_number_handed_as_to_copys_tensor_becomes_a_scalar_tensor():
    """torch hands a dispatch mode a wrapped number as the number itself (vmap's batching rule
    promoting ``i.float() * 2``): the graph makes the tensor, so backends lower a tensor."""
    gm = trace_aten(lambda x: torch.vmap(lambda i: i.float() * 2)(x), [torch.arange(4)], {})
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.scalar_tensor.default in targets
    assert all(
        not isinstance(n.args[0], (int, float))
        for n in gm.graph.nodes
        if n.target is torch.ops.aten._to_copy.default
    )
    x = torch.randperm(5)
    torch.testing.assert_close(gm(x)[0], x.float() * 2)
