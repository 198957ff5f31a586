"""State a compiled function depends on beyond its arguments, changed between calls: the answer
is always eager's.

Function objects: defaults, keyword defaults and globals belong to the function object, not its
code, so functions sharing a code object never run each other's entries, and a default
replaced or mutated after a call is seen. Modules: parameters and buffers are graph inputs whose
metadata can change in place (``.data =``, ``set_``, ``resize_``, ``requires_grad_``) and whose
dicts can be written behind ``Module.__setattr__``; plain attributes folded into the graph can be
written straight into ``__dict__``.
"""

from __future__ import annotations

import types

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def agree(compiled, eager, *args, calls=2, make=None):
    """Several calls with fresh inputs, each compared with eager."""
    for _ in range(calls):
        inputs = make() if make is not None else args
        want = eager(*inputs)
        got = compiled(*inputs)
        torch.testing.assert_close(got, want)


def fresh():
    return (torch.randn(4),)


# ---- function objects: defaults, keyword defaults, globals, code ----------------------------


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_lambdas_in_a_list_keep_their_own_defaults(backend):
    eager = [lambda x, k=k: x * k for k in (1.0, 2.0, 3.0)]
    fs = [kiln.compile(f, backend=backend) for f in eager]
    for _ in range(2):
        for f, e in zip(fs, eager, strict=True):
            agree(f, e, make=fresh)


def test_defaults_replaced_after_calls():
    def f(x, k=1.0):
        return x * k

    cf = kiln.compile(f, backend="eager")
    agree(cf, f, make=fresh)
    f.__defaults__ = (5.0,)
    agree(cf, f, make=fresh)
    f.__defaults__ = (torch.full((4,), 3.0),)  # a tensor default is a graph input
    agree(cf, f, make=fresh)
    f.__defaults__ = (torch.full((4,), 2.0),)  # same metadata, another tensor
    agree(cf, f, make=fresh)


def test_kwdefaults_replaced_or_mutated_in_place():
    def f(x, *, k=1.0):
        return x * k

    cf = kiln.compile(f, backend="eager")
    agree(cf, f, make=fresh)
    f.__kwdefaults__["k"] = 5.0
    agree(cf, f, make=fresh)
    f.__kwdefaults__ = {"k": 7.0}
    agree(cf, f, make=fresh)


def test_mutable_default_mutated_in_place():
    def f(x, scales=[1.0, 2.0]):  # noqa: B006 - the point of the test
        return x * scales[0] + len(scales)

    cf = kiln.compile(f, backend="eager")
    agree(cf, f, make=fresh)
    f.__defaults__[0][0] = 7.0
    agree(cf, f, make=fresh)
    f.__defaults__[0].append(3.0)
    agree(cf, f, make=fresh)


def test_same_code_other_globals():
    namespace = {"K": 1.0}
    exec("def f(x):\n    return x * K\n", namespace)
    first = namespace["f"]
    second = types.FunctionType(first.__code__, {"K": 2.0}, "f")
    c1, c2 = kiln.compile(first, backend="eager"), kiln.compile(second, backend="eager")
    for _ in range(2):
        agree(c1, first, make=fresh)
        agree(c2, second, make=fresh)


def test_code_replaced_after_calls():
    def f(x):
        return x + 1

    def g(x):
        return x + 2

    cf = kiln.compile(f, backend="eager")
    agree(cf, f, make=fresh)
    f.__code__ = g.__code__
    agree(cf, f, make=fresh)


def test_closures_with_defaults():
    def make(k):
        def f(x, j=k * 2):
            return x * j + k

        return f

    eager = [make(k) for k in (1.0, 2.0, 3.0)]
    fs = [kiln.compile(f, backend="eager") for f in eager]
    for f, e in zip(fs, eager, strict=True):
        agree(f, e, make=fresh)


def test_method_defaults():
    class Scaler:
        def apply(self, x, k=1.0):
            return x * k

    s = Scaler()
    cf = kiln.compile(s.apply, backend="eager")
    agree(cf, s.apply, make=fresh)
    Scaler.apply.__defaults__ = (3.0,)
    agree(cf, s.apply, make=fresh)


def inner(x, k=1.0):
    return x * k


compiled_inner = kiln.compile(inner, backend="eager")


def outer(x):
    return inner(x) + 1


def outer_compiled(x):
    return compiled_inner(x) + 1


@pytest.mark.parametrize("caller", [outer, outer_compiled])
def test_inlined_and_nested_compiled_callees(caller):
    cf = kiln.compile(caller, backend="eager")
    try:
        for k in (1.0, 4.0, 6.0):
            agree(cf, outer, make=fresh)  # (eager: the plain function)
            inner.__defaults__ = (k,)
            agree(cf, outer, make=fresh)
    finally:
        inner.__defaults__ = (1.0,)


def breaking(x, k=1.0):
    y = x * k
    print("", end="")  # breaks the graph: the rest runs in a resume function
    return y + k


def test_defaults_after_a_graph_break():
    cf = kiln.compile(breaking, backend="eager")
    try:
        agree(cf, breaking, make=fresh)
        breaking.__defaults__ = (2.0,)
        agree(cf, breaking, make=fresh)
    finally:
        breaking.__defaults__ = (1.0,)
    eager = [lambda x, k=k: (print("", end=""), x * k + k)[1] for k in (1.0, 2.0)]
    fs = [kiln.compile(f, backend="eager") for f in eager]
    for f, e in zip(fs, eager, strict=True):
        agree(f, e, make=fresh)


def test_unchanged_function_does_not_recompile():
    def f(x, k=1.0):
        return x * k

    cf = kiln.compile(f, backend="eager")
    agree(cf, f, make=fresh, calls=3)
    assert kiln.stats().frames_captured == 1
    kiln.compile(f, backend="eager")(torch.randn(4))  # another wrapper: the same entry
    assert kiln.stats().frames_captured == 1
