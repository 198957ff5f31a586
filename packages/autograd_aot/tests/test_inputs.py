"""Input layouts: bases for inputs that share memory with a mutated input."""

import torch

from kiln.autograd_aot.inputs import InputLayout, fakes_of
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
