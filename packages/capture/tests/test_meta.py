"""Fake tensors: metadata matches eager, devices propagate, autograd runs, data-dependent ops raise."""

import pytest
import torch

from kiln.capture import Unsupported
from kiln.capture.meta import (
    METADATA_MUTATIONS,
    DataDependentOp,
    FakeMode,
    FakeTensor,
    MetadataMutation,
    fake_like,
    is_fake,
    meta_of,
    storage_key,
    to_fake,
)


def _cuda_fake(*size: int) -> FakeTensor:
    return fake_like(torch.empty(*size, device="meta"), "cuda")


def _same_meta(fake: torch.Tensor, real: torch.Tensor) -> None:
    assert is_fake(fake)
    assert fake.shape == real.shape
    assert fake.dtype == real.dtype
    assert fake.device == real.device
    assert fake.stride() == real.stride()
    assert fake.storage_offset() == real.storage_offset()


def test_to_fake_reports_real_metadata():
    real = torch.randn(4, 6).t()[1:]
    fake = to_fake(real)
    _same_meta(fake, real)
    assert fake.meta.device.type == "meta"
    assert not is_fake(real)
    assert "FakeTensor" in repr(fake)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a @ b.t(),
        lambda a, b: (a + b).relu().sum(dim=1, keepdim=True),
        lambda a, b: torch.cat([a, b], 0)[::2].transpose(0, 1),
        lambda a, b: a.to(torch.float16) * 2,
        lambda a, b: torch.nn.functional.layer_norm(a, (5,)),
        lambda a, b: torch.softmax(a, -1).unsqueeze(0).expand(3, 4, 5),
        lambda a, b: a.view(2, 10).permute(1, 0).contiguous(),
        lambda a, b: torch.max(a, dim=0),
    ],
)
def test_ops_match_eager_metadata(fn):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    expect = fn(a, b)
    got = fn(to_fake(a), to_fake(b))
    for e, g in zip(torch.utils._pytree.tree_leaves(expect), torch.utils._pytree.tree_leaves(got)):
        _same_meta(g, e)


def test_mode_makes_factories_fake_and_memoizes():
    real = torch.randn(3, 3)
    with FakeMode() as mode:
        z = torch.zeros(2, 3)
        r = torch.rand(5, dtype=torch.float64)
        t = torch.tensor([1, 2, 3])
        mixed = real + z[:1, :1]
        assert mode.to_fake(real) is mode.to_fake(real)
    assert all(is_fake(x) for x in (z, r, t, mixed))
    assert r.dtype == torch.float64 and t.dtype == torch.int64
    assert mixed.shape == (3, 3)


def test_views_of_one_storage_alias():
    base = torch.randn(4, 4)
    view = base[1]
    mode = FakeMode()
    fb, fv = mode.to_fake(base), mode.to_fake(view)
    assert storage_key(fb) == storage_key(fv)
    assert storage_key(fb) != storage_key(mode.to_fake(torch.randn(4, 4)))
    assert fv.storage_offset() == 4
    _same_meta(fv, view)


def test_inplace_returns_same_fake():
    fake = to_fake(torch.randn(3))
    assert fake.add_(1) is fake
    out = to_fake(torch.empty(3))
    assert torch.add(fake, 1, out=out) is out


def test_device_propagation():
    x = _cuda_fake(2, 3)
    assert x.device == torch.device("cuda", 0)
    assert (x + 1).device == x.device
    assert (x * to_fake(torch.tensor(2.0))).device == x.device  # CPU scalar
    assert (to_fake(torch.tensor(2.0)) * x).device == x.device
    assert x.to("cpu").device == torch.device("cpu")
    # a device passed positionally (torch._refs._to_copy decomposes to this) is not run for real
    moved = torch.ops.prims.device_put.default(x, torch.device("cpu"))
    assert moved.device == torch.device("cpu") and moved.shape == x.shape
    assert x.new_zeros(3).device == x.device
    assert x.sum().device == x.device


def test_meta_of_real_and_fake():
    real = torch.randn(2, 3)
    assert meta_of(real).device.type == "meta"
    fake = to_fake(real)
    assert meta_of(fake) is fake.meta


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[0].item(),
        lambda x: x.nonzero(),
        lambda x: x.tolist(),
        lambda x: bool(x[0] > 0),
        lambda x: torch.unique(x),
        lambda x: x.masked_select(x > 0),
        lambda x: float(x.sum()),
        lambda x: x[x > 0],
    ],
)
def test_data_dependent_ops_raise(fn):
    with pytest.raises(DataDependentOp) as info:
        fn(to_fake(torch.randn(4)))
    assert isinstance(info.value, Unsupported)
    assert "data-dependent" in str(info.value)


def test_backward_on_fakes():
    x = to_fake(torch.randn(3, 4, requires_grad=True))
    assert x.requires_grad and x.is_leaf
    y = (x.sin() * x).sum()
    y.backward()
    assert is_fake(x.grad)
    _same_meta(x.grad, torch.empty(3, 4))


def test_autograd_grad_double_backward_on_fakes():
    with FakeMode():
        x = torch.randn(5, requires_grad=True)
        (g,) = torch.autograd.grad((x * x * x).sum(), x, create_graph=True)
        assert g.requires_grad
        (gg,) = torch.autograd.grad(g.sum(), x)
    assert is_fake(gg) and gg.shape == (5,)


def test_dropout_and_random_ops():
    with FakeMode():
        x = torch.randn(8, 8, requires_grad=True)
        y = torch.nn.functional.dropout(x, 0.5, training=True)
        y.sum().backward()
        n = torch.randint(0, 10, (3,))
    assert y.shape == (8, 8) and x.grad.shape == (8, 8)
    assert n.dtype == torch.int64


@pytest.mark.gpu  # autograd on CUDA fakes needs a CUDA driver
def test_backward_on_cuda_fakes():
    x = _cuda_fake(2, 3).requires_grad_()
    (x.sin() * x).sum().backward()
    assert x.grad.device == x.device


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.resize_(6),
        lambda x: x.as_strided_((3, 2), (1, 3)),
        lambda x: torch.add(x, 1, out=to_fake(torch.empty(0))),
    ],
)
def test_metadata_mutations_raise(fn):
    x = to_fake(torch.randn(2, 3))
    with pytest.raises(MetadataMutation):
        fn(x)
    assert x.shape == x.meta.shape == (2, 3)


def test_restrides_a_view_op_expresses_are_mirrored():
    """ATen's composites restride their own intermediates (vector @ matrix squeezes its mm
    in place): the fake and its meta tensor change as the real tensor would."""
    x = to_fake(torch.randn(2, 3))
    assert x.t_() is x and x.shape == x.meta.shape == (3, 2) and x.stride() == (1, 3)
    x.unsqueeze_(0).squeeze_(0)
    assert x.shape == x.meta.shape == (3, 2)
    v, m = to_fake(torch.randn(3)), to_fake(torch.randn(3, 2))
    assert (v @ m).shape == (2,)


def test_metadata_mutations_are_every_inplace_view_op():
    # capture and functionalization read this one set: it must hold every ATen op that
    # changes a tensor's metadata in place, whichever torch is installed
    tagged = set()
    for name in torch._C._dispatch_get_all_op_names():
        packet, _, overload = name.removeprefix("aten::").partition(".")
        if not name.startswith("aten::") or not hasattr(torch.ops.aten, packet):
            continue
        op = getattr(getattr(torch.ops.aten, packet), overload or "default", None)
        if op is not None and torch.Tag.inplace_view in op.tags:
            tagged.add(op.overloadpacket)
    assert tagged <= METADATA_MUTATIONS
    assert torch.ops.aten.detach_ in METADATA_MUTATIONS


def test_detach_in_place_runs_on_a_fake():
    x = to_fake(torch.randn(2, 3))
    assert x.detach_() is x and x.shape == (2, 3)


def test_deepcopy_and_storage():
    import copy

    fake = to_fake(torch.randn(3, 4).t())
    dup = copy.deepcopy(fake)
    assert is_fake(dup) and dup.shape == fake.shape and dup.stride() == fake.stride()
    assert storage_key(dup) != storage_key(fake)
    mode = FakeMode()
    base = torch.randn(4)
    a, b = mode.to_fake(base), mode.to_fake(base[1:])
    assert a.untyped_storage()._cdata == b.untyped_storage()._cdata


def test_masked_write_keeps_the_layout():
    x = to_fake(torch.randn(3, 4))
    mask = x > 0
    assert x.index_put_((mask,), torch.tensor(0.0)) is x
    out = torch.ops.aten.index_put.default(x, [mask], torch.tensor(1.0))
    assert is_fake(out) and out.shape == (3, 4) and out is not x
