"""Memory planning: frees, reuse and in-place writes never change results."""

import re

import pytest
import torch
from loopir_testing import check

from kiln.loopir.memory import plan_memory
from kiln.loopir.wrapper import clone_strided

aten = torch.ops.aten


def _block(x, w1, w2, g, b):
    ln = aten.native_layer_norm.default(x, [16], g, b, 1e-5)
    h = aten.gelu.default(aten.mm.default(ln[0], w1))
    y = aten.add.Tensor(aten.mm.default(h, w2), x)
    return y, ln[1], h


def test_transformer_like_stack_saving_activations():
    x = torch.randn(8, 16)
    w1, w2 = torch.randn(16, 32) * 0.2, torch.randn(32, 16) * 0.2
    g, b = torch.randn(16), torch.randn(16)

    def fn(x, w1, w2, g, b):
        saved = []
        for _ in range(3):
            x, mean, h = _block(x, w1, w2, g, b)
            saved += [mean, h, aten.relu.default(x)]
        return (x, *saved)

    c = check(fn, x, w1, w2, g, b, atol=1e-4, rtol=1e-4)
    assert "del " in c.source


def test_plan_reports_peak_and_never_frees_outputs():
    x = torch.randn(32, 32)

    def fn(x):
        a = aten.mm.default(x, x)
        b = aten.relu.default(a)
        c = aten.mm.default(b, x)
        return (aten.sigmoid.default(c), b)

    compiled = check(fn, x)
    plan = compiled.memory
    freed = {n for names in plan.free.values() for n in names}
    returned = compiled.source.splitlines()[-1]
    assert not any(re.search(rf"\b{name}\b", returned) for name in freed)
    assert plan.peak_bytes >= 32 * 32 * 4
    assert plan_memory([], lambda n: None, set()).peak_bytes == 0


def test_inputs_are_let_go_after_their_last_use_unless_returned():
    """The wrapper drops its reference to an input after the last step that reads it (a
    backward's saved activation can then die there); an input returned, or viewed by what
    is returned, is kept."""

    def fn(x, y, z):
        a = aten.mm.default(x, y)  # x and y are read here last
        b = aten.relu.default(aten.mm.default(a, a))
        return (b, z, aten.t.default(x))

    compiled = check(fn, torch.randn(8, 8), torch.randn(8, 8), torch.randn(8))
    dropped = {n for names in compiled.memory.free.values() for n in names}
    assert "y" in dropped
    assert not {"x", "z"} & dropped
    assert compiled.call_boxed([torch.eye(8), torch.eye(8), torch.ones(8)])[1].sum() == 8


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(4, 16, 8)[:, 0],  # gaps
        lambda: torch.randn(8, 1).expand(8, 5),  # overlap
        lambda: torch.randn(30)[7:19].view(3, 4).t(),  # offset, transposed
        lambda: torch.randn(4, 0, 3),  # empty
        lambda: torch.randn(3, 5),  # dense
    ],
    ids=["gaps", "overlap", "offset", "empty", "dense"],
)
def test_clone_strided_copies_the_layout(make):
    t = make()
    c = clone_strided(t)
    assert c.shape == t.shape and c.stride() == t.stride() and torch.equal(c, t)
    assert t.numel() == 0 or c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    if t.numel():  # a kernel indexing c with t's strides stays inside c's storage
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        assert c.storage_offset() + span <= c.untyped_storage().nbytes() // c.element_size()
