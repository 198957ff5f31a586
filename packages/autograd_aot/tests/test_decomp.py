"""The decomposition table."""

import torch

from kiln.autograd_aot import default_decompositions, kiln_decompositions
from kiln.autograd_aot.decomp import describe_table

aten = torch.ops.aten


def test_default_table_is_core_plus_kiln():
    table = default_decompositions()
    assert aten.silu.default in table  # core
    assert aten._softmax.default in table and aten.copy.default in table  # Kiln's
    assert set(kiln_decompositions()) <= set(table)
    assert not any(str(op).startswith("aten._scaled_dot_product_") for op in table)


def test_functional_copy_casts_and_broadcasts():
    copy = kiln_decompositions()[aten.copy.default]
    dst, src = torch.empty(3, 4, dtype=torch.float64), torch.randn(4)
    out = copy(dst, src)
    assert out.dtype == torch.float64 and out.shape == (3, 4)
    torch.testing.assert_close(out, src.double().expand(3, 4))
    same = torch.randn(2)
    assert copy(torch.empty(2), same) is not same


def test_describe_table_lists_ops():
    text = describe_table({aten.silu.default: None})
    assert text.startswith("1 decompositions") and "aten.silu.default" in text


def test_training_drops_fused_attention_decompositions():
    import torch._decomp

    from kiln.autograd_aot.decomp import for_training

    flash = aten._scaled_dot_product_flash_attention_for_cpu.default
    table = dict(torch._decomp.core_aten_decompositions().items())
    assert flash in table
    assert flash not in for_training(table)
    small = {aten.silu.default: None}
    assert for_training(small) is small


def test_training_with_a_raw_core_table_keeps_attention_gradients(check):
    import torch._decomp
    import torch.nn.functional as F

    from kiln.autograd_aot import aot_compile

    table = dict(torch._decomp.core_aten_decompositions().items())

    def backend(gm, example_inputs):
        return aot_compile(gm, example_inputs, fw_compiler=lambda g, e: g, decompositions=table)

    q, k, v = (torch.randn(1, 2, 5, 8, requires_grad=True) for _ in range(3))
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), [q, k, v], backend=backend)


def test_masked_index_put_becomes_where():
    from kiln.autograd_aot import trace_aten

    def fn(x):
        z = x.clone()
        z.index_put_((z > 0,), torch.tensor(0.0))
        return z

    gm = trace_aten(fn, [torch.randn(3, 4)], default_decompositions())
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.where.self in targets and aten.index_put.default not in targets
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x)[0], fn(x))
