"""Unsupported constructs: a structured error (kind, explanation, hint, user line), never a crash."""

from __future__ import annotations

import pytest
import torch

from kiln.capture import Unsupported, capture, counters
from kiln.capture.breaks.reasons import REASONS


def _capture(fn, *args, fullgraph=True):
    return capture(
        fn,
        args,
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
        fullgraph=fullgraph,
    )


def data_branch(x):
    if x.sum() > 0:
        return x
    return -x


def item_call(x):
    return x * x.sum().item()


def seeds(x):
    torch.manual_seed(0)
    return x


def global_delete(x):
    global _STATE
    del _STATE
    return x


def generator_fn(x):
    yield x


def raises(x):
    raise ValueError("nope")


def nonzero(x):
    return torch.nonzero(x)


_STATE = 0

CASES = [
    (data_branch, "data_dependent_branch", "if x.sum() > 0:"),
    (item_call, "data_dependent_value", "return x * x.sum().item()"),
    (seeds, "rng_reseeded", "torch.manual_seed(0)"),
    (global_delete, "side_effect", "del _STATE"),
    (raises, "user_exception", 'raise ValueError("nope")'),
    (nonzero, "data-dependent operator", "return torch.nonzero(x)"),
]


@pytest.mark.parametrize("fn,kind,line", CASES, ids=[c[0].__name__ for c in CASES])
def test_unsupported_is_structured(fn, kind, line):
    with pytest.raises(Unsupported) as info:
        _capture(fn, torch.randn(3), fullgraph=True)
    err = info.value
    assert err.kind == kind
    assert err.explanation and err.hint
    assert err.frame is not None
    assert err.frame.filename == __file__
    assert err.frame.source == line
    assert f"{__file__}:{err.frame.lineno}" in str(err)


def test_generator_root_refused():
    with pytest.raises(Unsupported) as info:
        _capture(generator_fn, torch.randn(3))
    assert info.value.kind == "unsupported_call"


def test_inner_frame_is_named():
    def outer(x):
        return data_branch(x) + 1

    with pytest.raises(Unsupported) as info:
        _capture(outer, torch.randn(3))
    assert info.value.frame.name == "data_branch"
    assert "outer" in info.value.user_stack


def test_every_kind_is_registered():
    for reason in REASONS.values():
        assert reason.explanation and reason.hint


def test_breaks_are_counted():
    counters.clear()
    with pytest.raises(Unsupported):
        _capture(data_branch, torch.randn(3))
    assert counters.snapshot()["graph_break"]["data_dependent_branch"] == 1


def test_grad_mode_restored_after_failure():
    def fn(x):
        with torch.no_grad():
            y = x * 2
            if y.sum() > 0:
                return y
        return x

    assert torch.is_grad_enabled()
    with pytest.raises(Unsupported):
        _capture(fn, torch.randn(3))
    assert torch.is_grad_enabled()


def test_unsupported_opcodes_have_handlers():
    import dis

    from kiln.capture.opcodes import HANDLERS

    assert set(dis.opmap) <= set(HANDLERS)


def test_instruction_budget_bounds_long_loops(monkeypatch):
    from kiln.capture import tracer

    monkeypatch.setattr(tracer, "MAX_STEPS", 500)

    def fn(x):
        for _ in range(1000):
            x = x + 1
        return x

    with pytest.raises(Unsupported) as info:
        _capture(fn, torch.randn(2))
    assert info.value.kind == "inline_limit"


def test_recursion_depth_is_bounded():
    def rec(x, n):
        return rec(x, n + 1)

    with pytest.raises(Unsupported) as info:
        _capture(rec, torch.randn(2), 0)
    assert info.value.kind == "inline_limit"
