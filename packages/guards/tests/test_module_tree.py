"""MODULE_TREE guards: one O(1) check for a whole module tree while nothing changed."""

from __future__ import annotations

import pytest
import torch

from kiln import guards
from kiln.capture.guard_data import GuardKind, GuardSpec
from kiln.capture.source import LocalSource
from kiln.guards import module_tree, stamps


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.eps = 1e-5
        self.act = torch.relu

    def forward(self, x):
        return self.norm(self.act(self.fc(x)) + self.eps)


class Net(torch.nn.Module):
    def __init__(self, depth=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
        self.register_buffer("offset", torch.zeros(4))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x + self.offset


def tree_check(model):
    return guards.build_check(
        [GuardSpec(LocalSource("self"), GuardKind.MODULE_TREE, model)], Net.forward
    )


def changed(check, model, part):
    reason = check.failure_reason(model, None)
    assert check(model, None) is False, reason
    assert reason is not None and part in reason, reason


def test_unchanged_tree_is_checked_by_stamp_without_walking(monkeypatch):
    model = Net()
    check = tree_check(model)
    assert check(model, None)
    walks = []
    tree = check.guards[0].expected
    monkeypatch.setattr(tree, "check", lambda v: walks.append(v) or True)
    check = tree_check(model)  # rebuilt: its generated code binds the patched walk
    assert check(model, None) and check(model, None)
    assert walks == []
    stamps.bump()
    assert check(model, None)


def test_walk_revalidates_after_unrelated_change():
    model, other = Net(), Net()
    check = tree_check(model)
    other.eps = 3.0  # bumps the stamp: model must be walked once, then is fast again
    assert check(model, None)
    tree = check.guards[0].expected
    assert tree.validated[0] == stamps.current()


def test_in_place_parameter_update_passes_replacement_fails():
    model = Net()
    check = tree_check(model)
    with torch.no_grad():
        model.blocks[1].fc.weight.mul_(2.0)
    model.offset.add_(1.0)
    assert check(model, None)
    model.blocks[1].fc.weight = torch.nn.Parameter(torch.randn(4, 4))
    changed(check, model, "parameter L['self'].blocks[1].fc.weight was replaced")


def test_eval_and_submodule_training():
    model = Net()
    check = tree_check(model)
    model.eval()
    changed(check, model, "L['self'].training changed: expected True, got False")
    model.train()
    assert check(model, None)
    model.blocks[2].norm.eval()
    changed(check, model, "L['self'].blocks[2].norm.training changed: expected True, got False")


def test_attribute_changes():
    model = Net()
    check = tree_check(model)
    model.blocks[0].eps = 1e-3
    changed(check, model, "L['self'].blocks[0].eps changed: expected 1e-05, got 0.001")
    model.blocks[0].eps = 1e-5
    assert check(model, None)
    model.blocks[0].act = torch.sigmoid
    changed(check, model, "L['self'].blocks[0].act was replaced")
    model.blocks[0].act = torch.relu
    model.blocks[0].extra = 1
    changed(check, model, "gained attribute 'extra'")
    del model.blocks[0].extra
    assert check(model, None)
    del model.blocks[0].eps
    changed(check, model, "lost attribute 'eps'")


def test_structure_changes():
    model = Net()
    check = tree_check(model)
    model.blocks[1] = Block()
    changed(check, model, "module L['self'].blocks[1] was replaced")
    model = Net()
    check = tree_check(model)
    model.blocks.append(Block())
    changed(check, model, "submodules changed")
    model = Net()
    check = tree_check(model)
    model.blocks[0].fc.register_buffer("scale", torch.ones(1))
    changed(check, model, "buffers changed")
    assert tree_check(Net())(model, None) is False  # another instance of the same class
    assert "different module object" in tree_check(Net()).failure_reason(model, None)


def test_dtype_change_in_place_is_caught():
    model = Block()
    check = tree_check(model)
    model.half()  # parameters keep their identity but change dtype
    changed(check, model, "parameter L['self'].fc.weight metadata changed: expected torch.float32")


def test_requires_grad_and_hooks():
    model = Net()
    check = tree_check(model)
    model.blocks[0].requires_grad_(False)
    changed(check, model, "metadata changed")
    model.blocks[0].requires_grad_(True)
    assert check(model, None)
    handle = model.blocks[1].fc.register_forward_hook(lambda *a: None)
    changed(check, model, "L['self'].blocks[1].fc forward hooks changed")
    handle.remove()
    assert check(model, None)


def test_direct_param_flag_needs_escape_hatch():
    model = Net()
    check = tree_check(model)
    model.blocks[0].fc.weight.requires_grad = False  # invisible to stamps (documented)
    assert check(model, None)
    guards.config.trust_module_stamps = False
    changed(check, model, "metadata changed")
    model.blocks[0].fc.weight.requires_grad = True
    assert check(model, None)
    assert check.guards[0].expected.validated[0] == -1  # never trusted while the flag is off


def test_shared_submodule_walked_once():
    shared = Block()
    model = torch.nn.ModuleDict({"a": shared, "b": shared})
    tree = module_tree.snapshot("L['m']", model)
    assert len(tree.records) == 4  # the dict, the block, its fc and norm: once each
    assert tree.explain(model) is None


@pytest.mark.parametrize("depth", [10, 100])
def test_stamped_check_does_not_walk_any_module(depth, monkeypatch):
    """Flat cost: with the stamp unchanged no module record is visited, however deep."""
    model = Net(depth)
    check = tree_check(model)
    visited = []
    real = module_tree._Quick.match
    monkeypatch.setattr(module_tree._Quick, "match", lambda q, m: visited.append(m) or real(q, m))
    assert check(model, None)
    assert visited == []
    stamps.bump()
    assert check(model, None)
    assert len(visited) == 1 + 1 + 3 * depth  # Net, ModuleList, each Block with fc and norm


def test_global_hooks_fail_the_tree():
    model = Net()
    check = tree_check(model)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda *a: None)
    try:
        changed(check, model, "global module hooks changed")
    finally:
        handle.remove()
    assert check(model, None)
