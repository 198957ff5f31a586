"""Grad-mode, inference-mode and autocast blocks inside captured functions."""

from __future__ import annotations

import pytest
import torch


@torch.no_grad()
def _decorated(x):
    return x * 2


@torch.enable_grad()
def _decorated_enable(x):
    return x * 3


def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y + x, y.requires_grad


def nested_modes(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
        c = x * 4
    return a, b, c


def set_grad_statement(x):
    torch.set_grad_enabled(False)
    y = x * 2
    torch.set_grad_enabled(True)
    return y, x * 3


def set_grad_with(x, flag):
    with torch.set_grad_enabled(flag):
        y = x * 2
    return y


def decorated_call(x):
    return _decorated(x) + 1


def decorated_enable_inside_no_grad(x):
    with torch.no_grad():
        return _decorated_enable(x)


def inner_decorator(x):
    @torch.no_grad()
    def g(y):
        return y * 5

    return g(x), x * 1


def inference_block(x):
    with torch.inference_mode():
        y = x * 2
    return y


def autocast_block(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        z = torch.relu(y)
    return z.float() + x.sum(), z.dtype


def autocast_disabled(x):
    with torch.autocast("cpu", enabled=False):
        return x @ x


def is_grad_enabled_read(x):
    with torch.no_grad():
        flag = torch.is_grad_enabled()
    return x * 2 if not flag else x


PROGRAMS = [
    no_grad_block,
    nested_modes,
    set_grad_statement,
    decorated_call,
    decorated_enable_inside_no_grad,
    inner_decorator,
    inference_block,
    is_grad_enabled_read,
]


@pytest.mark.parametrize("fn", PROGRAMS, ids=[f.__name__ for f in PROGRAMS])
def test_grad_modes(check, fn):
    check(fn, (torch.randn(3, requires_grad=True),))
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("flag", [True, False])
def test_set_grad_enabled_argument(check, flag):
    check(set_grad_with, (torch.randn(3, requires_grad=True), flag))


def test_grad_mode_nodes(check):
    res = check(no_grad_block, (torch.randn(3, requires_grad=True),))
    targets = [n.target for n in res.graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count(torch._C._set_grad_enabled) == 2


def test_autocast(check):
    res = check(autocast_block, (torch.randn(3, 4), torch.randn(4, 2)))
    names = [getattr(n.target, "__name__", "") for n in res.graphs[0].graph.nodes]
    assert names.index("_enter_autocast") < names.index("matmul") < names.index("_exit_autocast")
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_disabled(check):
    check(autocast_disabled, (torch.randn(3, 3),))


def test_capture_under_outer_no_grad(check):
    with torch.no_grad():
        check(no_grad_block, (torch.randn(3, requires_grad=True),))
