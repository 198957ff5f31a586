"""Input layouts: bases for inputs that share memory with a mutated input."""

import torch

from kiln.autograd_aot.inputs import InputLayout, fakes_of, shared_memory
from kiln.capture.meta import storage_key


def test_no_layout_without_aliasing_mutation():
    a, b = torch.randn(3), torch.randn(3)
    assert InputLayout.for_mutations([a, b], [0]) is None
    base = torch.randn(6)
    assert InputLayout.for_mutations([base[:3], base[3:]], []) is None


def test_layout_replaces_a_group_by_its_storage():
    base = torch.randn(8)
    x, y, z = base[:4], base[2:].view(3, 2), torch.randn(2)
    layout = InputLayout.for_mutations([x, y, z], [1])
    assert layout.groups == ((0, 1),) and layout.kept == (2,)
    prepared = layout.prepare([x, y, z])
    assert prepared[0] is z
    assert prepared[1].shape == (8,) and prepared[1].data_ptr() == base.data_ptr()

    seen = []
    layout.wrap(lambda *args: seen.extend(args))(*prepared)
    assert [t.shape for t in seen] == [(4,), (3, 2), (2,)]
    torch.testing.assert_close(seen[1], y)


def test_fakes_alias_like_the_inputs():
    base = torch.randn(6)
    a = base[:3]
    fakes, leaves = fakes_of([a, base[3:], a], needs_grad=False)
    assert storage_key(fakes[0]) == storage_key(fakes[1])
    assert fakes[0] is not fakes[2]  # the same tensor twice gets two fakes...
    assert storage_key(fakes[0]) != storage_key(fakes[2])  # ...traced independently
    assert leaves == fakes


def _groups(primals, mutated):
    return [(g[0], g[1]) for g in shared_memory(primals, mutated)]


def test_shared_memory_finds_what_overlaps_a_mutated_input():
    base = torch.randn(8)
    z = torch.randn(3)
    assert shared_memory([torch.randn(3), z], [0]) == ()
    assert _groups([z, z], [0]) == [((0, 1), "storage")]
    assert _groups([base, base[2:4]], [1]) == [((0, 1), "storage")]
    assert _groups([base[:4], base[2:6]], [0]) == [((0, 1), "storage")]
    assert _groups([base[::2], base[1::2]], [0]) == [((0, 1), "storage")]  # safe side
    assert shared_memory([base[:4], base[4:]], [0]) == ()  # one storage, no overlap
    assert shared_memory([z, z], []) == ()  # nothing written: aliasing does not matter
    assert shared_memory([base[:0], base], [0]) == ()


def test_shared_memory_records_the_views_it_was_traced_for():
    base = torch.randn(8)
    first = shared_memory([base[:4], base[2:6]], [0])
    assert shared_memory([base[:4], base[2:6]], [0]) == first
    assert shared_memory([base[:4], base[1:5]], [0]) != first  # another offset
    assert shared_memory([torch.randn(9)[:4], base[2:6]], [0]) == ()


def test_shared_memory_with_grad_uses_the_common_autograd_base():
    y = torch.randn(8, requires_grad=True) * 1
    assert _groups([y[:4], y[2:6]], [0]) == [((0, 1), "autograd")]
    assert _groups([y, y], [0]) == [((0, 1), "autograd")]
    layout = InputLayout.for_mutations([y[:4], y[2:6]], [0])
    assert layout.prepare([y[:4], y[2:6]])[0] is y
    ((_, kind),) = _groups([y[:4], y.detach()[2:6]], [0])
    assert kind.startswith("inputs that require grad")
    ((_, kind),) = _groups([base := torch.zeros(4), base.view(torch.int32)], [0])
    assert kind == "inputs of several dtypes"


def test_fakes_of_non_leaf_inputs_keep_their_strides():
    base = torch.randn(6, 4, requires_grad=True)
    y = base[:, 2:]  # not dense: clone() would make it contiguous
    fakes, leaves = fakes_of([y], needs_grad=True)
    assert fakes[0].stride() == y.stride() and fakes[0].shape == y.shape
    assert fakes[0].requires_grad and fakes[0].grad_fn is not None and leaves[0].is_leaf
