"""Torch-function modes (``TorchFunctionMode``) entered inside a captured function."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from kiln.capture import GlobalState, GuardKind, Unsupported, capture


class AddOne(TorchFunctionMode):
    """Adds 1 to the result of every ``torch.add`` / ``Tensor.add`` (``+`` included)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.add or func is torch.Tensor.add:
            out = out + 1  # the mode is popped here: this add is not rewritten again
        return out


class DoubleMul(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.mul:
            out = out * 2
        return out


class IndexAsGather(TorchFunctionMode):
    """Rewrites ``x[i]`` with a tensor index, as transformers' masking code does."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and isinstance(args[1], torch.Tensor):
            return torch.index_select(args[0], 0, args[1].reshape(-1)) * 10
        return func(*args, **(kwargs or {}))


class SeesKwargs(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is F.softmax and "dim" in kwargs:
            kwargs["dim"] = 0
        return func(*args, **kwargs)


def add_one_block(x, y):
    a = x * y
    with AddOne():
        b = torch.add(a, y) + x
        c = F.relu(b) * 3
    return c - a + b


def nested_blocks(x, y):
    with AddOne():
        b = x + y
        with DoubleMul():
            c = b * y + x
        d = c * x
    return b, c, d


def index_block(x, i):
    with IndexAsGather():
        picked = x[i]
    return picked, x[0]


def kwargs_block(x):
    with SeesKwargs():
        return F.softmax(x, dim=1)


def _capture(fn, args):
    return capture(fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f)


@pytest.mark.parametrize(
    ("fn", "make"),
    [
        (add_one_block, lambda: (torch.randn(3, 4), torch.randn(3, 4))),
        (nested_blocks, lambda: (torch.randn(3, 4), torch.randn(3, 4))),
        (index_block, lambda: (torch.randn(5, 3), torch.tensor([3, 1]))),
        (kwargs_block, lambda: (torch.randn(3, 4),)),
    ],
    ids=["add_one", "nested", "getitem", "kwargs"],
)
def test_mode_block_one_graph(fn, make):
    result = _capture(fn, make())
    assert len(result.graphs) == 1
    assert not result.graph_breaks
    assert torch._C._len_torch_function_stack() == 0
    for _ in range(3):
        args = make()
        torch.testing.assert_close(result.function(*args), fn(*args))


def test_mode_rewrites_are_in_the_graph():
    result = _capture(add_one_block, (torch.randn(2), torch.randn(2)))
    adds = [n for n in result.graphs[0].graph.nodes if "add" in str(n.target)]
    # torch.add and ``+`` each rewritten (op, then +1), then the two adds after the block
    assert len(adds) == 5


def test_break_inside_mode_block_runs_frame_eagerly():
    def fn(x):
        with AddOne():
            y = x + 1
            z = y * float(y.sum())  # a data-dependent value breaks the graph
        return z

    with pytest.raises(Unsupported):
        _capture(fn, (torch.randn(3),))
    assert torch._C._len_torch_function_stack() == 0


def test_break_after_mode_block_resumes():
    def fn(x):
        with AddOne():
            y = x + 1
        z = y * float(y.sum())
        return z + x

    result = _capture(fn, (torch.randn(3),))
    assert len(result.graph_breaks) == 1
    x = torch.randn(3)
    torch.testing.assert_close(result.function(x), fn(x))


def test_mode_active_at_call_gives_up():
    def fn(x, y):
        return torch.add(x, y) * 2

    # the graph would run without the mode: capture refuses and the frame runs eagerly
    with AddOne(), pytest.raises(Unsupported, match="torch-function mode"):
        _capture(fn, (torch.randn(3), torch.randn(3)))
    result = _capture(fn, (torch.randn(3), torch.randn(3)))
    state = next(g.expected for g in result.guards if g.kind is GuardKind.GLOBAL_STATE)
    assert state.function_modes == 0
    with AddOne():
        assert GlobalState.current().function_modes == 1
        with torch.device("cpu"):
            assert GlobalState.current().function_modes == 1


class Counting(TorchFunctionMode):
    """Counts what torch hands it: ops, operators and property reads alike."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def counted_block(x):
    mode = Counting()
    with mode:
        n = x.shape[0]
        y = x.reshape(n, -1) * x.dtype.itemsize + x.T.sum()
    return y, mode.calls


def counted_len_iter(x):
    mode = Counting()
    with mode:
        n = len(x)
        rows = [r * 2 for r in x]
    return n, rows, mode.calls


def test_mode_sees_len_and_iteration():
    result = _capture(counted_len_iter, (torch.randn(3, 4),))
    assert len(result.graphs) == 1
    x = torch.randn(3, 4)
    got, expected = result.function(x), counted_len_iter(x)
    torch.testing.assert_close(got, expected)
    assert got[2] == 1 + 2 + 3  # len; dim and unbind; one mul per row


def test_mode_sees_properties_and_operators():
    result = _capture(counted_block, (torch.randn(3, 4),))
    assert len(result.graphs) == 1
    x = torch.randn(3, 4)
    got, expected = result.function(x), counted_block(x)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1] == expected[1] == 7


def disabled_blocks(x):
    with AddOne():
        with torch._C.DisableTorchFunction():
            a = torch.add(x, 1)  # no mode runs here
            with torch._C.DisableTorchFunctionSubclass():
                b = torch.add(x, 1)  # still none: the outer block disabled them
        with torch._C.DisableTorchFunctionSubclass():
            c = torch.add(x, 1)  # modes run: only subclasses are disabled
        d = torch.add(x, 1)
    return a, b, c, d


def popped_for_a_while(x):
    with AddOne():
        mode = torch.overrides._pop_mode()
        a = torch.add(x, 1)
        torch.overrides._push_mode(mode)
        b = torch.add(x, 1)
    return a, b


@pytest.mark.parametrize("fn", [disabled_blocks, popped_for_a_while], ids=lambda f: f.__name__)
def test_mode_stack_switches(fn):
    result = _capture(fn, (torch.zeros(3),))
    assert len(result.graphs) == 1
    assert not result.graph_breaks
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(result.function(x), fn(x))


@contextlib.contextmanager
def _without_mode():
    mode = torch.overrides._pop_mode()
    try:
        yield
    finally:
        torch.overrides._push_mode(mode)


def popped_in_generator(x):
    with AddOne():
        with _without_mode():
            return torch.add(x, 1)


def test_mode_stack_changed_by_a_generator_is_not_traced():
    # a generator runs to its end at its call: the pop and the push would both precede the add
    with pytest.raises(Unsupported):
        _capture(popped_in_generator, (torch.zeros(3),))


class Bias(TorchFunctionMode):
    """A mode made outside the frame: its tensor is a graph input, its counter a side effect."""

    def __init__(self, b):
        super().__init__()
        self.b = b
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.mul:
            out = out + self.b
        return out


BIAS = Bias(torch.randn(3))


def global_mode_block(x):
    with BIAS:
        y = F.linear(x, torch.ones(3, 3)) * 2
    return y * 3


def test_mode_made_outside_the_frame():
    result = _capture(global_mode_block, (torch.randn(2, 3),))
    assert len(result.graphs) == 1
    # the counter's store is replayed from the value it had at capture (guards would recompile
    # when it changes): one call right after capture counts as eager's does
    start = BIAS.n
    x = torch.randn(2, 3)
    got = result.function(x)
    assert BIAS.n == start + 3
    torch.testing.assert_close(got, global_mode_block(x))
    assert BIAS.n == start + 6
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(result.function(x), global_mode_block(x))


@contextlib.contextmanager
def _no_grad_around():
    previous = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        yield
    finally:
        torch.set_grad_enabled(previous)


def grad_off_in_generator(x):
    with _no_grad_around():
        y = x * 2
    return y * 3, y.requires_grad


def balanced_generator(x):
    def items():
        with torch.no_grad():
            a = x * 2  # grad mode back on before the yield: the consumer sees no change
        yield a
        yield x + 1

    return sum(items())


def test_generator_yielding_under_changed_grad_mode_is_not_traced_whole():
    # the generator runs to its end at its call: the block would run with grad enabled again
    result = _capture(grad_off_in_generator, (torch.randn(3, requires_grad=True),))
    assert result.graph_breaks
    x = torch.randn(3, requires_grad=True)
    got, expected = result.function(x), grad_off_in_generator(x)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1] is expected[1] is False
    assert torch.is_grad_enabled()
    ok = _capture(balanced_generator, (torch.randn(3, requires_grad=True),))
    assert len(ok.graphs) == 1 and not ok.graph_breaks
