"""The functionalization pass: no mutating op survives; views and inputs come out right."""

import pytest
import torch

from kiln.autograd_aot import UnsupportedMutation, trace_aten
from kiln.autograd_aot.mutation import functional_variant, is_mutation, is_view

aten = torch.ops.aten


def _no_mutations(gm):
    for n in gm.graph.nodes:
        if n.op == "call_function" and hasattr(n.target, "_schema"):
            assert not is_mutation(n.target), n.format_node()


def test_functional_variants():
    assert functional_variant(aten.add_.Tensor).op is aten.add.Tensor
    out = functional_variant(aten.add.out)
    assert out.op is aten.add.Tensor and out.drop == ("out",)
    bn = functional_variant(aten._native_batch_norm_legit.default)
    assert bn.op is aten._native_batch_norm_legit_functional.default and bn.appends_values
    assert is_view(aten.t.default) and not is_view(aten.add_.Tensor)


def test_functional_variant_matches_argument_types():
    # fill_.Tensor and fill.Scalar both take (self, value): the types choose the overload
    assert functional_variant(aten.fill_.Tensor).op is aten.fill.Tensor
    assert functional_variant(aten.fill_.Scalar).op is aten.fill.Scalar
    assert functional_variant(aten.masked_fill_.Tensor).op is aten.masked_fill.Tensor


def test_tensor_assigned_into_a_slice():
    """BART's ``shift_tokens_right``: ``new[:, 0] = start`` with a 0-d tensor (``fill_.Tensor``)."""

    def fn(ids, start):
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1].clone()
        shifted[:, 0] = start
        return shifted * 1

    ids, start = torch.randint(0, 50, (3, 7)), torch.tensor(5)
    gm = trace_aten(fn, [ids, start], {})
    _no_mutations(gm)
    (got,) = gm(ids, start)
    torch.testing.assert_close(got, fn(ids, start))


def test_view_mutation_updates_base_and_aliases():
    def fn(x):
        z = x * 1
        v = z.t()
        row = z[1]
        v[0].mul_(10)  # writes column 0 of z
        return z + 0, row * 1

    x = torch.randn(3, 4)
    gm = trace_aten(fn, [x], {})
    _no_mutations(gm)
    for got, want in zip(gm(x), fn(x)):
        torch.testing.assert_close(got, want)


def test_input_mutation_returned_as_extra_output():
    def fn(x, buf):
        buf[1:].add_(x[1:])
        return x * 2

    x, buf = torch.randn(3), torch.randn(3)
    gm = trace_aten(fn, [x, buf], {})
    _no_mutations(gm)
    out, new_buf = gm(x, buf.clone())
    expect_buf = buf.clone()
    torch.testing.assert_close(out, fn(x, expect_buf))
    torch.testing.assert_close(new_buf, expect_buf)


def test_batchnorm_running_stats_are_functional():
    bn = torch.nn.BatchNorm1d(3)
    x = torch.randn(4, 3)
    gm = trace_aten(
        lambda x, m, v: torch.nn.functional.batch_norm(x, m, v, training=True),
        [x, bn.running_mean, bn.running_var],
        {},
    )
    _no_mutations(gm)
    assert len(gm(x, bn.running_mean, bn.running_var)) == 3  # output, mean, var


def test_metadata_mutation_of_an_input_is_rejected():
    with pytest.raises(UnsupportedMutation, match="sizes or strides"):
        trace_aten(lambda x: x.t_(), [torch.randn(2, 3)], {})


def _restrided(x):
    z = x * 1
    v = z[0]  # taken before: keeps its own view of the storage
    z.t_()
    z[0].add_(1)  # a write through the new view reaches v
    w = z.unsqueeze_(0)
    return z, v, w.sum(), z.squeeze_(0) * 2


def test_metadata_mutation_of_an_intermediate_is_the_view_from_then_on():
    """ATen's composites restride their own intermediates (matmul of a vector squeezes its
    mm in place, torch.func's batching rules pass that down): the tensor becomes the view."""
    x = torch.randn(2, 3)
    gm = trace_aten(_restrided, [x], {})
    torch.testing.assert_close(gm(x.clone()), _restrided(x.clone()))


def test_mutating_an_expanded_view_is_rejected():
    # fill_ writes an expanded tensor in eager (add_ raises eager's overlap error instead)
    with pytest.raises(UnsupportedMutation, match="view op"):
        trace_aten(lambda x: (x * 1).expand(2, 3).fill_(1), [torch.randn(3)], {})


def test_a_write_eager_refuses_raises_eager_s_error():
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        trace_aten(lambda x: (x * 1).expand(2, 3).add_(1), [torch.randn(3)], {})
    with pytest.raises(RuntimeError, match="some elements of the input tensor"):
        trace_aten(lambda x: x[:2].add_(x[1:]), [torch.randn(3)], {})


def test_tensors_made_from_data_may_be_mutated():
    def fn(x):
        z = torch.tensor([1.0, 2.0, 3.0])
        z.add_(x)
        w = torch.zeros(3)
        w[1] = 5.0
        return z * 2 + w

    x = torch.randn(3)
    gm = trace_aten(fn, [x], {})
    _no_mutations(gm)
    torch.testing.assert_close(gm(x)[0], fn(x))


def test_random_fills_in_place():
    def fn(x):
        w = torch.empty(2000)
        torch.nn.init.normal_(w, 2.0, 0.5)
        u = torch.empty(2000).uniform_(-1, 1)
        return x + w.mean(), w.std(), u.min(), u.max()

    assert functional_variant(aten.normal_.default).op is aten.normal_functional.default
    gm = trace_aten(fn, [torch.randn(3)], {})
    _no_mutations(gm)
    shifted, std, lo, hi = gm(torch.zeros(3))
    assert abs(shifted.mean().item() - 2) < 0.1 and abs(std.item() - 0.5) < 0.05
    assert -1 <= lo.item() and hi.item() <= 1
