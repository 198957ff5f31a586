"""Cache entries per code object: newest first, recompile reasons, the limit, skip_guards."""

from __future__ import annotations

import logging

import pytest
import torch

from kiln import guards
from kiln.capture import counters
from kiln.capture.guard_data import GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import LocalSource


def double(x):
    return x * 2


def insert_for(cache, x):
    """What the frontend does on a miss: guards from the example, then insert."""
    check = guards.build_check(
        [GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, TensorMeta.of(x))], double
    )
    compiled = lambda x: double(x)  # stands in for the captured function
    return cache.insert(check, compiled)


def test_hit_runs_the_entry_and_miss_returns_none():
    cache = guards.cache_for(double.__code__)
    assert guards.cache_for(double.__code__) is cache
    x = torch.randn(3)
    assert cache.lookup(x) is None
    entry = insert_for(cache, x)
    hit = cache.lookup(torch.randn(3))
    assert hit is entry
    y = torch.randn(3)
    torch.testing.assert_close(hit.fn(y), double(y))
    assert "def double(x):" in entry.guard_source
    assert cache.lookup(torch.randn(4)) is None


def test_newest_entry_first():
    cache = guards.cache_for(double.__code__)
    older = cache.insert(guards.build_check([], double), double)
    newer = cache.insert(guards.build_check([], double), double)
    assert cache.entries == [newer, older]
    assert cache.lookup(1) is newer


def test_recompile_is_logged_with_the_failing_guard(caplog):
    cache = guards.cache_for(double.__code__)
    insert_for(cache, torch.randn(8))
    counters.clear()
    with caplog.at_level(logging.INFO, logger="kiln.guards.recompiles"):
        assert cache.lookup(torch.randn(16)) is None
        insert_for(cache, torch.randn(16))
    text = caplog.text
    # in the user's words: their function, file:line with its text, and variable
    assert (
        "recompiling double (" in text and "test_cache.py:" in text and "`def double(x):`" in text
    )
    assert "tensor x size mismatch at index 0: expected 8, got 16" in text
    assert counters.snapshot()["guards"]["recompiles"] == 1


def test_cache_failure_reason_lists_each_entry():
    cache = guards.cache_for(double.__code__)
    assert cache.failure_reason(torch.randn(2)) == "no compiled entries yet"
    insert_for(cache, torch.randn(8))
    insert_for(cache, torch.randn(16))
    reason = cache.failure_reason(torch.randn(4))
    assert "entry 0: tensor L['x'] size mismatch at index 0: expected 16, got 4" in reason
    assert "entry 1: tensor L['x'] size mismatch at index 0: expected 8, got 4" in reason
    assert cache.failure_reason(torch.randn(8)) is None


def test_limit_warns_once_naming_the_guard():
    guards.config.recompile_limit = 2
    cache = guards.cache_for(double.__code__)
    for n in (1, 2):
        assert not cache.over_limit()
        insert_for(cache, torch.randn(n))
    assert cache.over_limit()
    assert not cache.over_limit(limit=3)  # the frontend may pass its own limit
    with pytest.warns(RuntimeWarning, match="expected 2, got 3") as record:
        cache.warn_limit_once(torch.randn(3))
        cache.warn_limit_once(torch.randn(4))
    assert len(record) == 1
    assert record[0].filename == __file__  # pointed at the first caller outside kiln


def apply(m, x):
    return m(x)


def test_limit_counts_entries_per_module_object():
    """Each layer of a loop that breaks in every iteration gets its entry (as Dynamo
    counts entries per module object); ``accumulated_recompile_limit`` bounds them all."""
    guards.config.recompile_limit = 2
    cache = guards.cache_for(apply.__code__)
    layers = [torch.nn.Linear(2, 2) for _ in range(5)]
    for m in layers:
        assert not cache.over_limit((m, torch.randn(3)))
        spec = GuardSpec(LocalSource("m"), GuardKind.MODULE_MATCH, id(m))
        cache.insert(guards.build_check([spec], apply), apply)
    assert cache.lookup(layers[3], torch.randn(3)) is not None
    assert not cache.over_limit((torch.nn.Linear(2, 2), torch.randn(3)))
    x = torch.randn(4)
    spec = GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, TensorMeta.of(x))
    cache.insert(guards.build_check([spec], apply), apply)  # no module: counts for every call
    assert cache.over_limit((layers[0], x)) and not cache.over_limit((layers[0], x), limit=3)
    guards.config.accumulated_recompile_limit = 6
    assert cache.over_limit((torch.nn.Linear(2, 2), torch.randn(3)))


def test_limit_can_raise():
    guards.config.recompile_limit = 1
    cache = guards.cache_for(double.__code__)
    insert_for(cache, torch.randn(1))
    with pytest.raises(
        guards.RecompileLimitExceeded, match="size mismatch at index 0: expected 1, got 5"
    ):
        cache.raise_limit_error(torch.randn(5))


def test_skip_guards_runs_newest_without_checking():
    cache = guards.cache_for(double.__code__)
    entry = insert_for(cache, torch.randn(8))
    assert cache.lookup(torch.randn(9)) is None
    guards.config.skip_guards = True
    assert cache.lookup(torch.randn(9)) is entry


def test_reset_clears_everything():
    cache = guards.cache_for(double.__code__)
    insert_for(cache, torch.randn(8))
    guards.reset()
    assert cache.entries == []
    assert guards.cache_for(double.__code__).entries == []


def test_recompile_log_names_the_newest_entry_at_info_and_all_at_debug(caplog):
    cache = guards.cache_for(double.__code__)
    insert_for(cache, torch.randn(8))
    insert_for(cache, torch.randn(16))
    with caplog.at_level(logging.INFO, logger="kiln.guards.recompiles"):
        assert cache.lookup(torch.randn(4)) is None
        insert_for(cache, torch.randn(4))
    assert "expected 16, got 4 (and 1 older entries)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kiln.guards.recompiles"):
        assert cache.lookup(torch.randn(2)) is None
        insert_for(cache, torch.randn(2))
    assert "entry 2: tensor x size mismatch at index 0: expected 8, got 2" in caplog.text
