"""Compiling apart from the process: the collector spares the objects made before a capture."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from kiln.capture import capture
from kiln.capture.isolation import older_objects_spared


@pytest.fixture(autouse=True)
def _thawed():
    """Each test starts with no object frozen: some interpreters start with a few hundred
    frozen (3.12 here), where compiles leave the collector alone."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    yield
    if frozen:
        gc.freeze()


class _Made:
    """An instance the collector tracks (a dict of strings alone it does not)."""


def _tracked(obj: object) -> bool:
    """Whether a collection traverses ``obj`` (``gc.get_objects`` lists the generations only,
    not the permanent one)."""
    return any(o is obj for o in gc.get_objects())


def test_older_objects_are_frozen_while_compiling_and_thawed_after() -> None:
    before = _Made()
    assert gc.get_freeze_count() == 0
    with older_objects_spared():
        assert gc.get_freeze_count() > 0 and not _tracked(before)
        assert gc.is_tracked(before)
        during = _Made()
        assert _tracked(during)
        with older_objects_spared():  # nested: one freeze
            pass
        assert not _tracked(before)
    assert gc.get_freeze_count() == 0 and _tracked(before) and _tracked(during)


def test_a_capture_runs_with_older_objects_spared() -> None:
    seen = []

    def compile_graph(gm, example_inputs):
        seen.append(gc.get_freeze_count())
        return gm.forward

    def fn(x):
        return torch.sin(x) + 1

    capture(fn, (torch.randn(3),), {}, compile_graph=compile_graph, wrap_callable=lambda f: f)
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0


def test_where_objects_were_frozen_full_collections_wait_until_the_compile_ends() -> None:
    """Thawing after would thaw the process's own frozen objects: the compile defers full
    collections instead (young ones still run), and puts the thresholds back after."""
    gc.freeze()
    thresholds = gc.get_threshold()
    try:
        count = gc.get_freeze_count()
        # neither frozen more nor thawed (a frozen object that dies leaves the count, so the
        # count may only fall)
        with older_objects_spared():
            assert 0 < gc.get_freeze_count() <= count
            raised = gc.get_threshold()
            assert raised[:2] == thresholds[:2] and raised[2] > 1_000_000
            with older_objects_spared():  # nested: one raise
                assert gc.get_threshold() == raised
            assert gc.get_threshold() == raised
            collected = []
            gc.callbacks.append(lambda phase, info: collected.append(info["generation"]))
            try:
                kept = []
                for _ in range(200_000):  # enough for many young collections
                    a: list[object] = []
                    a.append(a)  # a cycle: only the collector frees it
                    kept.append(_Made())
            finally:
                gc.callbacks.pop()
            assert collected and 2 not in collected
        assert gc.get_threshold() == thresholds
        assert 0 < gc.get_freeze_count() <= count
        with older_objects_spared():  # the program sets its own thresholds meanwhile: kept
            gc.set_threshold(500, 5, 5)
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def test_a_process_that_disabled_the_collector_is_left_alone() -> None:
    thresholds = gc.get_threshold()
    gc.disable()
    try:
        with older_objects_spared():
            assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds
    finally:
        gc.enable()


def test_concurrent_compiles_share_the_freeze_until_the_last_ends() -> None:
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with older_objects_spared():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with older_objects_spared():
        thread.start()
        assert inside.wait(10)
    assert gc.get_freeze_count() > 0  # the other thread still compiles
    leave.set()
    thread.join(10)
    assert gc.get_freeze_count() == 0
