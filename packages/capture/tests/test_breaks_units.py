"""Focused checks of the break machinery: results, counters, nesting, carriers, refusals."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from kiln.capture import Unsupported, capture, counters
from kiln.capture.breaks.frame import MAX_RESUME_NESTING
from kiln.capture.breaks.rollback import GradModeExit, ResumeIterator


def _capture(fn, *args, fullgraph=False, wrap=lambda f: f):
    return capture(
        fn,
        args,
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=wrap,
        fullgraph=fullgraph,
    )


def branch(x):
    y = x.cos()
    if y.sum() > 0:
        return y + 1
    return y - 1


def test_result_records_the_break_and_counts_it_once():
    counters.clear()
    result = _capture(branch, torch.randn(3))
    (brk,) = result.graph_breaks
    assert brk.kind == "data_dependent_branch"
    assert brk.frame.source == "if y.sum() > 0:"
    assert counters.snapshot()["graph_breaks"] == {"data_dependent_branch": 1}
    x = torch.randn(3)
    torch.testing.assert_close(result.function(x), branch(x))


def test_fullgraph_still_raises():
    with pytest.raises(Unsupported) as info:
        _capture(branch, torch.randn(3), fullgraph=True)
    assert info.value.kind == "data_dependent_branch"


def test_continuations_go_through_wrap_callable():
    wrapped = []

    def wrap(fn):
        wrapped.append(fn.__name__)
        return fn

    _capture(branch, torch.randn(3), wrap=wrap)
    assert len(wrapped) == 2 and all(n.startswith("resume_at_") for n in wrapped)


def test_long_loop_with_breaks_keeps_the_stack_shallow():
    def loop(x):
        for _ in range(3000):
            x = x + float(np.float32(0.001))
        return x

    calls = 0

    def wrap(fn):
        def call(*args):
            nonlocal calls
            calls += 1
            return _capture(fn, *args, wrap=wrap).function(*args)

        return call

    x = torch.randn(2)
    torch.testing.assert_close(_capture(loop, x, wrap=wrap).function(x), loop(x))
    assert calls <= 2 * MAX_RESUME_NESTING + 2


def test_resume_iterator_and_grad_mode_exit():
    it = ResumeIterator([1, 2])
    assert list(it) == [1, 2] and list(it) == []
    assert torch.is_grad_enabled()
    leave = GradModeExit(False, True)
    assert not torch.is_grad_enabled()
    leave(None, None, None)
    assert torch.is_grad_enabled()


def test_unresumable_break_runs_eagerly_with_a_logged_reason(caplog):
    def in_except(x):
        try:
            raise KeyError("k")
        except KeyError:
            if x.sum() > 0:
                return x
        return -x

    with caplog.at_level(logging.INFO, logger="kiln.capture.breaks.split"):
        with pytest.raises(Unsupported):
            _capture(in_except, torch.randn(3))
    assert "the frame runs eagerly" in caplog.text


def test_side_effects_are_applied_before_the_native_instruction():
    def fn(x, lst):
        lst.append(1.0)
        n = float(np.asarray(lst).sum())  # runs natively: it must see the append
        lst.append(2.0)
        return x * n

    result = _capture(fn, torch.randn(2), [0.5])
    lst, x = [0.5], torch.randn(2)
    torch.testing.assert_close(result.function(x, lst), x * 1.5)
    assert lst == [0.5, 1.0, 2.0]
