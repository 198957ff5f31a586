"""Seeded random ops: deterministic given a seed, eager's distributions, recomputed in backward."""

import torch
import torch.nn.functional as F
from torch import fx

from kiln.autograd_aot import aot_eager_decomp_partition
from kiln.autograd_aot.rng import seed, seeded_random


def test_same_seed_same_bits():
    s = seed(device=torch.device("cpu"))
    a = seeded_random(s, [1000], "uniform", dtype=torch.float32, device=torch.device("cpu"))
    b = seeded_random(s, [1000], "uniform", dtype=torch.float32, device=torch.device("cpu"))
    assert torch.equal(a, b)
    other = seeded_random(s + 1, [1000], "uniform", dtype=torch.float32, device="cpu")
    assert not torch.equal(a, other)


def test_distributions_match_eager():
    s = seed(device=torch.device("cpu"))
    u = seeded_random(s, [20000], "uniform", dtype=torch.float32, device="cpu")
    n = seeded_random(s, [20000], "normal", dtype=torch.float64, device="cpu")
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.02
    assert n.dtype == torch.float64 and abs(n.std().item() - 1) < 0.03


def test_seed_follows_manual_seed():
    torch.manual_seed(3)
    a = seed(device=torch.device("cpu"))
    torch.manual_seed(3)
    assert torch.equal(a, seed(device=torch.device("cpu")))


def test_dropout_saves_a_seed_and_recomputes_the_mask():
    x = (torch.rand(32, 32) + 0.5).requires_grad_()
    compiled = aot_eager_decomp_partition(fx.symbolic_trace(lambda x: F.dropout(x, 0.3)), [x])
    program = compiled.variant(joint=True)
    bw_targets = [n.target for n in program.backward.graph.nodes]
    assert seeded_random in bw_targets
    assert compiled.partition_stats.saved_bytes == 8  # one int64 seed, no mask
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, (out != 0).float() / 0.7)
