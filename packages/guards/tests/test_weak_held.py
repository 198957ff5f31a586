"""A built check holds the user objects it compares by identity weakly.

Its cache lives as long as the function does, so a strong reference would keep a module the
user dropped (or rebound) alive; a dead referent must make the guard fail, never pass.
"""

from __future__ import annotations

import gc
import weakref

import torch

from kiln import guards
from kiln.capture.guard_data import GuardKind, GuardSpec
from kiln.capture.source import GlobalSource, LocalSource

model: torch.nn.Module | None = None


def uses_global(x):
    return model(x)


def method_like(self, x):
    return self.lin(x)


def test_id_matched_global_module_is_held_weakly_and_a_dead_one_fails():
    global model
    model = torch.nn.Linear(4, 4)
    r = weakref.ref(model)
    check = guards.build_check(
        [GuardSpec(GlobalSource("model"), GuardKind.ID_MATCH, id(model))], uses_global
    )
    x = torch.randn(2, 4)
    assert check(x) is True
    model = None
    gc.collect()
    assert r() is None  # the check did not keep it
    assert check(x) is False  # None is not the module it was built for
    assert check.failure_reason(x) is not None
    model = torch.nn.Linear(4, 4)
    assert check(x) is False


def test_module_tree_of_a_local_holds_the_module_weakly():
    m = torch.nn.Module()
    m.lin = torch.nn.Linear(4, 4)
    r = weakref.ref(m)
    check = guards.build_check(
        [
            GuardSpec(LocalSource("self"), GuardKind.MODULE_TREE, m),
            GuardSpec(LocalSource("self"), GuardKind.MODULE_MATCH, id(m)),
        ],
        method_like,
    )
    x = torch.randn(2, 4)
    assert check(m, x) is True
    other = torch.nn.Module()
    other.lin = torch.nn.Linear(4, 4)
    assert check(other, x) is False
    assert "different module" in (check.failure_reason(other, x) or "")
    del m
    gc.collect()
    assert r() is None
    assert check(other, x) is False


def test_an_entry_whose_held_module_dies_is_dropped():
    global model
    model = torch.nn.Linear(4, 4)
    cache = guards.CodeCache(uses_global.__code__)
    check = guards.build_check(
        [GuardSpec(GlobalSource("model"), GuardKind.ID_MATCH, id(model))], uses_global
    )
    cache.insert(check, uses_global)
    keep = torch.nn.Linear(4, 4)
    other = guards.build_check(
        [GuardSpec(GlobalSource("model"), GuardKind.ID_MATCH, id(model))], uses_global
    )
    cache.insert(other, uses_global)
    assert len(cache.entries) == 2
    x = torch.randn(2, 4)
    assert cache.lookup(x) is cache.entries[0]
    model = keep
    gc.collect()
    assert cache.entries == []  # both checks held the dead module: neither can pass again
    assert cache.lookup(x) is None
