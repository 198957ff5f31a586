"""What moves the module stamp."""

from __future__ import annotations

import torch

from kiln.guards import stamps


def moves(action) -> bool:
    stamps.install()
    before = stamps.current()
    action()
    return stamps.current() != before


def test_module_changes_move_the_stamp():
    m = torch.nn.Linear(2, 2)
    assert moves(lambda: setattr(m, "foo", 1))
    assert moves(lambda: delattr(m, "foo"))
    assert moves(m.eval)
    assert moves(lambda: m.register_buffer("b", torch.ones(1)))
    assert moves(lambda: m.register_parameter("p", torch.nn.Parameter(torch.ones(1))))
    assert moves(lambda: m.add_module("child", torch.nn.ReLU()))
    assert moves(m.double)
    assert moves(lambda: m.requires_grad_(False))
    handle = None

    def register():
        nonlocal handle
        handle = m.register_forward_pre_hook(lambda *a: None)

    assert moves(register)
    assert moves(handle.remove)


def test_functional_call_moves_it():
    m = torch.nn.Linear(2, 2)
    stamps.install()
    seen = []
    m.register_forward_pre_hook(lambda *a: seen.append(stamps.current()))
    before = stamps.current()
    params = {"weight": torch.randn(2, 2), "bias": torch.randn(2)}
    torch.func.functional_call(m, params, (torch.randn(1, 2),))
    assert seen[0] != before  # moved before forward ran with the swapped-in tensors
    assert stamps.current() != seen[0]  # and again when the originals came back


def test_reads_and_in_place_math_do_not_move_it():
    m = torch.nn.Linear(2, 2)
    x = torch.randn(3, 2)
    assert not moves(lambda: m(x))
    assert not moves(lambda: m.weight.data.add_(1))
    assert not moves(lambda: m.training)


def test_install_is_idempotent():
    stamps.install()
    setattr_fn = torch.nn.Module.__setattr__
    stamps.install()
    assert torch.nn.Module.__setattr__ is setattr_fn
    assert stamps.installed()
