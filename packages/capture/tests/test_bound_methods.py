"""Bound methods read from the frame are guarded by their parts, never by identity.

``obj.meth`` (and ``arr.mean``, ``lst.append``) makes a new object on every read, so an
identity guard on one fails on the next call: a continuation that gets such a method on its
stack, or a function passed one as an argument, would be captured again on every call. The
``Cache`` below reuses entries while their guards hold (kiln.guards' job, in small), so the
tests can count entries over many calls with fresh inputs.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kiln.capture import GuardKind, GuardSpec, capture
from kiln.capture.guard_data import GlobalState, TensorMeta


def _holds(g: GuardSpec, frame: dict[str, Any], fn: types.FunctionType) -> bool:
    if g.kind is GuardKind.GLOBAL_STATE:
        now = GlobalState.current()
        if g.expected.default_device is None:
            now = dataclasses.replace(now, default_device=None)
        return bool(now == g.expected)
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    try:
        v = g.source.resolve(frame, fn.__globals__, cells)
    except Exception:
        return False
    checks: dict[GuardKind, Callable[[], bool]] = {
        GuardKind.TENSOR_MATCH: lambda: TensorMeta.of(v) == g.expected,
        GuardKind.TYPE_MATCH: lambda: type(v) is g.expected,
        GuardKind.ID_MATCH: lambda: id(v) == g.expected,
        GuardKind.MODULE_MATCH: lambda: id(v) == g.expected,
        GuardKind.EQUALS: lambda: type(v) is type(g.expected) and v == g.expected,
        GuardKind.IS_NONE: lambda: v is None,
        GuardKind.NOT_NONE: lambda: v is not None,
        GuardKind.BOOL: lambda: bool(v) is g.expected,
        GuardKind.DICT_KEYS: lambda: tuple(v.keys()) == g.expected,
        GuardKind.SEQUENCE_LENGTH: lambda: len(v) == g.expected,
        GuardKind.HASATTR: lambda: hasattr(v, g.expected[0]) is g.expected[1],
        GuardKind.MODULE_TREE: lambda: v is g.expected,
        GuardKind.HOOKS_EMPTY: lambda: True,  # no test here registers hooks
    }
    return checks[g.kind]()


class Cache:
    """Captured entries per code object, continuations included, reused while their guards hold."""

    def __init__(self) -> None:
        self.entries: dict[types.CodeType, list[tuple[list[GuardSpec], Callable[..., Any]]]] = (
            defaultdict(list)
        )

    def wrap(self, fn: types.FunctionType) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            frame = dict(inspect.signature(fn).bind(*args).arguments)
            for guards, compiled in self.entries[fn.__code__]:
                if all(_holds(g, frame, fn) for g in guards):
                    return compiled(*args)
            result = capture(
                fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=self.wrap
            )
            self.entries[fn.__code__].append((result.guards, result.function))
            return result.function(*args)

        return call

    def sizes(self) -> list[int]:
        return [len(e) for e in self.entries.values()]


def _run(
    fn: Callable[..., Any], make_args: Callable[[], tuple[Any, ...]], calls: int = 10
) -> Cache:
    """Call ``fn`` through a ``Cache`` on fresh arguments, comparing each result with eager."""
    cache = Cache()
    compiled = cache.wrap(fn)
    for _ in range(calls):
        args = make_args()
        torch.testing.assert_close(compiled(*args), fn(*args))
    return cache


def numpy_scale(x):
    h = torch.relu(x)
    # ndarray.mean of an array numpy made (not traced): a break, then its read
    s = np.array(h.detach()).mean(axis=0, keepdims=True)
    return h * torch.as_tensor(s) + 1


def test_a_method_of_a_fresh_numpy_array_is_captured_once():
    cache = _run(numpy_scale, lambda: (torch.randn(8, 4),))
    assert len(cache.entries) >= 3  # the frame and its continuations after each break
    assert cache.sizes() == [1] * len(cache.entries)


def append_across_break(x):
    outs = [x]
    outs.append(torch.from_numpy(np.tanh(x.numpy())))  # the bound append waits on the stack
    return torch.stack(outs)


def test_append_of_a_fresh_list_across_a_break_is_traced_and_captured_once():
    cache = _run(append_across_break, lambda: (torch.randn(5),))
    assert cache.sizes() == [1] * len(cache.entries)


class Scaler:
    def __init__(self, k: float) -> None:
        self.k = k

    def scale(self, x):
        return x * self.k


def apply(x, fn):
    return fn(x) + 1


def test_a_method_of_a_fresh_object_is_guarded_by_function_and_receiver():
    cache = _run(apply, lambda: (torch.randn(3), Scaler(2.0).scale))
    assert cache.sizes() == [1]
    # what the receiver holds still counts: another k is another entry, with its own result
    _check_all(cache, apply, [(torch.randn(3), Scaler(k).scale) for k in (2.0, 3.0, 3.0)])
    assert cache.sizes() == [2]


def apply_across_break(x, fn):
    return fn(torch.from_numpy(np.tanh(x.numpy())))  # the method waits on the stack


def test_a_method_of_a_fresh_object_across_a_break_is_read_again_from_the_frame():
    cache = _run(apply_across_break, lambda: (torch.randn(3), Scaler(2.0).scale))
    assert cache.sizes() == [1] * len(cache.entries)


def _check_all(cache: Cache, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> None:
    compiled = cache.wrap(fn)
    for args in calls:
        torch.testing.assert_close(compiled(*args), fn(*args))


def push(x, add):
    add(x * 2)
    return x.sin()


def test_c_methods_of_fresh_containers_are_traced_on_the_container():
    cache = Cache()
    compiled = cache.wrap(push)
    for _ in range(10):
        x, got, want = torch.randn(3), [], []
        torch.testing.assert_close(compiled(x, got.append), push(x, want.append))
        assert len(got) == 1
        torch.testing.assert_close(got[0], want[0])  # the append reached the real list
    assert cache.sizes() == [1]
    lookup = _run(
        lambda x, get: x * get("k") + len(get.__name__), lambda: (torch.randn(3), {"k": 2.0}.get)
    )
    assert lookup.sizes() == [1]


def test_the_guards_name_the_parts_of_a_method_not_its_identity():
    def guards(fn, *args):
        result = capture(
            fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f
        )
        return {(str(g.source), g.kind): g.expected for g in result.guards}

    g = guards(apply, torch.randn(3), Scaler(2.0).scale)
    assert g[("L['fn'].__func__", GuardKind.ID_MATCH)] == id(Scaler.scale)
    assert g[("L['fn'].__self__", GuardKind.TYPE_MATCH)] is Scaler
    assert g[("L['fn'].__self__.k", GuardKind.EQUALS)] == 2.0
    assert ("L['fn']", GuardKind.ID_MATCH) not in g
    c = guards(lambda x, get: x * get("k"), torch.randn(3), {"k": 2.0}.get)
    assert c[("L['get'].__name__", GuardKind.EQUALS)] == "get"
    assert c[("L['get'].__self__", GuardKind.DICT_KEYS)] == ("k",)
    assert ("L['get']", GuardKind.ID_MATCH) not in c
    # functions of C modules are stable objects: still one identity test
    stable = guards(apply, torch.randn(3), torch.sin)
    assert stable[("L['fn']", GuardKind.ID_MATCH)] == id(torch.sin)


class Holder:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn


def through_holder(x, holder):
    return holder.fn(x)


def test_a_stored_method_given_another_receiver_is_noticed():
    first, second = Scaler(2.0), Scaler(5.0)
    holder = Holder(first.scale)
    cache = Cache()
    compiled = cache.wrap(through_holder)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, holder), x * 2)
    holder.fn = second.scale
    torch.testing.assert_close(compiled(x, holder), x * 5)
    holder.fn = Scaler(2.0).scale  # another object, same function and state: the first entry
    torch.testing.assert_close(compiled(x, holder), x * 2)
    assert cache.sizes() == [2]
