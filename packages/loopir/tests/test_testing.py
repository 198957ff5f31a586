"""kiln.loopir.testing: the helpers backend authors' tests share."""

import pytest
import torch

from kiln.loopir import ReferenceBackend, testing
from kiln.loopir.virtualized import ops

aten = torch.ops.aten


def test_check_compares_a_program_with_eager():
    x = torch.randn(4, 5)
    compiled = testing.check(lambda x: aten.add.Tensor(aten.sin.default(x), 1), x)
    torch.testing.assert_close(compiled(x), x.sin() + 1)


def test_check_compares_on_the_values_both_runs_start_from():
    x = torch.randn(6)
    testing.check(lambda x: (aten.add_.Tensor(x, 1),), x)


def test_a_hand_built_group_runs_on_the_reference_backend():
    x = testing.inp("x", torch.float32, [3, 4])
    load = x.make_loader()
    doubled = testing.pointwise("buf0", torch.float32, [3, 4], lambda i: ops.mul(load(i), load(i)))
    g = testing.group("k", [x], [(doubled, "pointwise")], 12)
    value = testing.random_tensor(torch.float32, [3, 4])
    (out,) = testing.outputs_for(g)
    assert (out == 7).all()  # an element the kernel skips shows
    ReferenceBackend().codegen_kernel(g).fn(value, out)
    torch.testing.assert_close(out, value * value)


@pytest.mark.parametrize("kind", ["int", "positive", "above_one", "small_int", "shift", "bool"])
def test_random_tensor_kinds(kind):
    t = testing.random_tensor(torch.float64, [64], kind, stride=[2])
    assert t.stride() == (2,) and t.shape == (64,)
    low = {"int": -20, "positive": 0.1, "above_one": 1.1, "small_int": 1, "shift": 0, "bool": 0}
    assert (t >= low[kind]).all()
    if kind == "int":
        assert (t != 0).all()  # a divisor
