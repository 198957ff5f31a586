"""Code found on a class and inlined by a trace, changed on the class between calls: the answer
is always eager's.

A method, property, static or class method lives on the class, not on the instance the frame
reads, so the instance's guards cannot see ``A.f = other``: each (class, name) the trace looked
up is guarded once, however many instances share it (monkey-patching a library class, replacing
a module class's ``forward``, an ``autograd.Function``'s ``forward`` or ``backward``).
"""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.capture.guard_data import GuardKind


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def agree(compiled, eager, calls=2):
    for _ in range(calls):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), eager(x))


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_method_reassigned_on_the_class(backend):
    class A:
        def f(self, x):
            return x + 1

    a = A()

    def g(x):
        return a.f(x)

    cg = kiln.compile(g, backend=backend)
    agree(cg, g)
    A.f = lambda self, x: x * 3
    agree(cg, g)


def test_method_of_a_base_class_reassigned():
    class Base:
        def f(self, x):
            return x + 1

    class Child(Base):
        def g(self, x):
            return super().f(x) + self.f(x)

    c = Child()

    def g(x):
        return c.g(x)

    cg = kiln.compile(g, backend="eager")
    agree(cg, g)
    Base.f = lambda self, x: x - 5
    agree(cg, g)


def test_property_static_and_class_methods_reassigned():
    class A:
        scale = 2.0

        @property
        def k(self):
            return 1.0

        @staticmethod
        def s(x):
            return x + 1

        @classmethod
        def c(cls, x):
            return x * cls.scale

    a = A()

    def g(x):
        return a.s(x) * a.k + A.c(x) + A.s(x)

    cg = kiln.compile(g, backend="eager")
    agree(cg, g)
    A.k = property(lambda self: 3.0)
    agree(cg, g)
    A.s = staticmethod(lambda x: x - 1)
    agree(cg, g)
    A.c = classmethod(lambda cls, x: x * 10)
    agree(cg, g)


@pytest.mark.parametrize("name", ["forward", "helper"])
def test_module_class_method_reassigned(name):
    class M(torch.nn.Module):
        def helper(self, x):
            return x * 2

        def forward(self, x):
            return self.helper(x)

    m = M()
    cm = kiln.compile(m)
    agree(cm, m)
    setattr(M, name, lambda self, x: x * 7)
    agree(cm, m)


def test_autograd_function_forward_and_backward_reassigned():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def g(x):
        return F.apply(x)

    cg = kiln.compile(g, backend="aot_eager")

    def grads():
        x = torch.randn(4, requires_grad=True)
        want = torch.autograd.grad(g(x).sum(), x)[0]
        x2 = x.detach().requires_grad_()
        out = cg(x2)
        torch.testing.assert_close(out, g(x.detach()))
        torch.testing.assert_close(torch.autograd.grad(out.sum(), x2)[0], want)

    grads()
    F.forward = staticmethod(lambda ctx, x: x * 5)
    grads()
    F.backward = staticmethod(lambda ctx, gr: gr * 9)
    grads()


def class_attr_guards():
    """The CLASS_ATTR guards of every compiled entry alive."""
    return [
        g
        for cache in kiln.api._caches.values()
        for entry in cache.entries
        for g in entry.check.guards
        if g.kind is GuardKind.CLASS_ATTR
    ]


def test_one_guard_per_class_not_per_instance():
    m = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(6)])
    cm = kiln.compile(m, backend="eager")
    x = torch.randn(2, 4)
    cm(x)
    cm(x)
    linear = [g.expected.name for g in class_attr_guards() if g.expected.owner is torch.nn.Linear]
    assert sorted(linear) == ["__call__", "forward"]


def test_unchanged_classes_do_not_recompile():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).relu()

    m = M()
    cm = kiln.compile(m, backend="eager")
    for _ in range(5):
        cm(torch.randn(2, 4))
    entries = sum(len(c.entries) for c in kiln.api._caches.values())
    assert entries == 1
