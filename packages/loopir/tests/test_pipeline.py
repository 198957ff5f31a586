"""End-to-end structure tests: how many kernels common programs become."""

import torch
from loopir_testing import check

aten = torch.ops.aten


def test_sin_cos_is_one_kernel():
    c = check(lambda x: (aten.cos.default(aten.sin.default(x)),), torch.randn(8, 16))
    assert c.kernel_count == 1


def test_add_sum_is_one_kernel():
    def fn(a, b):
        return (aten.sum.dim_IntList(aten.add.Tensor(a, b), [1]),)

    c = check(fn, torch.randn(4, 8), torch.randn(4, 8))
    assert c.kernel_count == 1


def test_softmax_last_dim_is_one_kernel():
    c = check(lambda x: (aten._softmax.default(x, -1, False),), torch.randn(4, 8))
    assert c.kernel_count == 1
