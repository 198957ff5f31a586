"""Creation lowerings (full, arange, iota, *_like) and seeded, device-independent randomness."""

import torch
from loopir_testing import Input, check_calls, compile_fn, fill_meta, graph_of_calls, to_meta

from kiln.loopir import ReferenceBackend, compile_graph, random_bits

aten = torch.ops.aten
prims = torch.ops.prims


def test_constants_and_ranges():
    x = Input(0)
    cpu = {"device": "cpu"}
    calls = [
        (aten.full.default, [[2, 3], 1.5], {"dtype": torch.float32, **cpu}),
        (aten.full.default, [[4], 7], {"dtype": torch.int64, **cpu}),
        (aten.zeros.default, [[3, 2]], {"dtype": torch.float16, **cpu}),
        (aten.ones.default, [[5]], {"dtype": torch.bool, **cpu}),
        (aten.zeros_like.default, [x], {}),
        (aten.ones_like.default, [x], {"dtype": torch.int64}),
        (aten.full_like.default, [x, -2.0], {}),
        (aten.new_zeros.default, [x, [2]], {}),
        (aten.new_ones.default, [x, [2, 2]], {}),
        (aten.new_full.default, [x, [3], 4.0], {}),
        (aten.scalar_tensor.default, [3.0], {"dtype": torch.float32, **cpu}),
        (aten.arange.default, [6], {"dtype": torch.int64, **cpu}),
        (aten.arange.start, [2, 9], {"dtype": torch.int64, **cpu}),
        (aten.arange.start_step, [1, 10, 3], {"dtype": torch.int64, **cpu}),
        (aten.arange.start_step, [0.5, 3.0, 0.25], {"dtype": torch.float32, **cpu}),
        (
            prims.iota.default,
            [5],
            {"start": 3, "step": 2, "dtype": torch.int64, **cpu, "requires_grad": False},
        ),
    ]
    check_calls(calls, torch.randn(3, 4))


def test_empty_has_the_right_metadata():
    cpu = {"dtype": torch.float32, "device": "cpu"}
    calls = [
        (aten.empty.memory_format, [[2, 3]], cpu),
        (aten.empty_like.default, [Input(0)], {}),
        (aten.empty_strided.default, [[2, 2], [1, 2]], cpu),
        (aten.new_empty.default, [Input(0), [5]], {}),
        (aten.new_empty_strided.default, [Input(0), [3], [1]], {}),
        (aten.rand.default, [[64, 64]], cpu),
        (aten.randn.default, [[64, 64]], cpu),
    ]
    gm = graph_of_calls(1, calls)
    fill_meta(gm, [to_meta(torch.randn(4))])
    out = compile_graph(gm, [], backend=ReferenceBackend())(torch.randn(4))
    assert [tuple(o.shape) for o in out] == [(2, 3), (4,), (2, 2), (5,), (3,), (64, 64), (64, 64)]
    assert 0 <= out[5].min() and out[5].max() < 1 and abs(out[6].mean()) < 0.1


def _random_fn(x):
    return (
        aten.rand_like.default(aten.expand.default(aten.select.int(x, 1, 0), [1000, 200])),
        aten.randn_like.default(aten.expand.default(aten.select.int(x, 1, 0), [1000, 200])),
        aten.rand_like.default(x),
        aten.bernoulli.p(x, 0.25),
        aten.native_dropout.default(x, 0.5, True)[0],
    )


def test_random_is_seeded_and_well_distributed():
    x = torch.ones(200, 100)
    compiled = compile_fn(_random_fn, x)
    torch.manual_seed(0)
    first = compiled(x)
    torch.manual_seed(0)
    again = compiled(x)
    later = compiled(x)
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b)
    assert not torch.equal(first[0], later[0])
    u, n = first[0], first[1]
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    assert abs(n.mean()) < 0.02 and abs(n.std() - 1) < 0.02
    assert abs(first[3].float().mean() - 0.25) < 0.02
    dropped = first[4]
    assert set(dropped.unique().tolist()) <= {0.0, 2.0}
    assert abs((dropped == 0).float().mean() - 0.5) < 0.03


def test_random_bits_match_the_spec():
    seed, offsets = 123456, torch.arange(0, 1000, 37)
    bits = random_bits.kiln_hash32(torch.tensor(seed), offsets, 0)
    key = random_bits.fmix32_int(seed & random_bits.MASK32)
    expected = [
        random_bits.fmix32_int((key + 2 * o) & random_bits.MASK32) for o in offsets.tolist()
    ]
    assert bits.tolist() == expected
