"""The partitioning policy: what the forward saves, recomputation, statistics."""

import operator

import torch
from torch import fx

from kiln.autograd_aot import aot_compile, aot_eager, aot_eager_decomp_partition
from kiln.autograd_aot.partition import recomputable

aten = torch.ops.aten


def _chain(x):
    return x.sin().cos().sin().cos().sin()


def _saved_inputs(compiled):
    fw = compiled.variant(joint=True).forward
    out = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    return out[1:]  # after the one user output


def test_sin_cos_chain_saves_only_x(check):
    x = torch.randn(8, 8, requires_grad=True)
    compiled = check(_chain, [x], backend=aot_eager_decomp_partition)
    saved = _saved_inputs(compiled)
    assert [n.op for n in saved] == ["placeholder"]
    stats = compiled.partition_stats
    assert stats.num_saved == 1 and stats.saved_input_bytes == 8 * 8 * 4
    assert stats.saved_bytes == 0 and stats.save_all_bytes == 5 * 8 * 8 * 4
    bw = compiled.variant(joint=True).backward
    assert sum(n.target is aten.sin.default for n in bw.graph.nodes) >= 2  # recomputed


def test_save_all_saves_every_used_forward_value(check):
    x = torch.randn(8, 8, requires_grad=True)
    compiled = check(_chain, [x], backend=aot_eager)
    assert compiled.partition_stats.saved_bytes == compiled.partition_stats.save_all_bytes


def test_matmul_output_is_saved_not_recomputed(check):
    def fn(x, w):
        return (x @ w).relu().sum(1)

    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    compiled = check(fn, [x, w], backend=aot_eager_decomp_partition)
    bw = compiled.variant(joint=True).backward
    mms = [n for n in bw.graph.nodes if n.target is aten.mm.default]
    assert len(mms) == 2  # the two gradient matmuls; the forward one is not recomputed


def test_an_activation_a_backward_matmul_reads_is_saved_not_recomputed(check):
    """An MLP's GELU output feeds the second layer's weight gradient (a matmul): recomputed,
    the backward would store it again; it is saved, with GELU's derivative (computed in the
    forward, the same bytes as the matmul's output it would otherwise save)."""

    def fn(x, w1, w2):
        return torch.nn.functional.gelu(x @ w1) @ w2

    x, w1 = torch.randn(4, 8, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    w2 = torch.randn(16, 8, requires_grad=True)
    compiled = check(fn, [x, w1, w2], backend=aot_eager_decomp_partition)
    bw = compiled.variant(joint=True).backward
    assert not any(n.target is aten.erf.default for n in bw.graph.nodes)  # no GELU recomputed
    assert compiled.partition_stats.saved_bytes == 2 * 4 * 16 * 4


def test_a_saved_view_of_an_input_is_saved_as_the_input(check):
    """A linear layer's backward reads its weight through ``t(t(w))``: the forward saves the
    weight itself and the backward makes the views again (returned as an output of its own, a
    view of an input was stored into a buffer of its own by loopir, a copy per layer per step);
    a mutated input's views are left to the cut."""

    def fn(x, w, b):
        return torch.nn.functional.linear(x, w, b).relu()

    x = torch.randn(4, 8, requires_grad=True)
    w, b = torch.randn(16, 8, requires_grad=True), torch.randn(16, requires_grad=True)
    compiled = check(fn, [x, w, b], backend=aot_eager_decomp_partition)
    saved = _saved_inputs(compiled)
    assert not any(
        n.op == "call_function"
        and n.all_input_nodes[0].op == "placeholder"
        and n.target in (aten.t.default, aten.permute.default)
        for n in saved
    )
    assert {n.name for n in saved if n.op == "placeholder"} >= {"primals_2"}  # w itself


def test_random_ops_are_not_recomputed():
    g = fx.Graph()
    x = g.placeholder("x")
    rand = g.call_function(aten.rand_like.default, (x,))
    add = g.call_function(aten.add.Tensor, (x, rand))
    item = g.call_function(operator.getitem, (add, 0))
    view = g.call_function(aten.t.default, (x,))
    mm = g.call_function(aten.mm.default, (x, x))
    assert not recomputable(rand)
    assert recomputable(add) and recomputable(item) and recomputable(view)
    assert not recomputable(mm)


def test_partition_stats_logged(caplog):
    x = torch.randn(4, requires_grad=True)
    with caplog.at_level("INFO", logger="kiln.autograd_aot.aot"):
        aot_compile(fx.symbolic_trace(_chain), [x], fw_compiler=lambda gm, ex: gm)
    text = caplog.text
    assert "decomposition table" in text and "save-all" in text
