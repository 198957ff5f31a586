"""What capture knows of Python's own behaviour must hold for the user's objects: the answer is
always eager's.

An instance attribute set after a call shadows the method (or non-data descriptor, or
``__getattr__`` answer) the trace found on the class. A dataclass dict that looks like
transformers' ``ModelOutput`` but has methods of its own runs them. A ``functools`` cache hands
back what it cached, even after the state its function read has changed.
"""

from __future__ import annotations

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def agree(compiled, eager, calls=2):
    """Several calls with fresh inputs, each compared with eager."""
    for _ in range(calls):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), eager(x))


# ---- an instance attribute shadowing what the class gives ------------------------------------


class Plain:
    def f(self, x):
        return x + 1


class NonData:
    """A descriptor without ``__set__``: an instance attribute of its name wins over it."""

    def __get__(self, obj, owner=None):
        return lambda x: x * 3


class WithDescriptor:
    f = NonData()


class Fallback:
    def __getattr__(self, name):
        return lambda x: x - 1


@pytest.mark.parametrize("backend", ["eager", "kiln"])
@pytest.mark.parametrize("cls", [Plain, WithDescriptor, Fallback])
def test_instance_attribute_set_after_a_call_shadows_the_class(backend, cls):
    a = cls()

    def g(x):
        return a.f(x)

    cg = kiln.compile(g, backend=backend)
    agree(cg, g)
    a.f = lambda x: x + 2
    agree(cg, g)
    del a.f  # the class's again
    agree(cg, g)


def test_shadowed_method_of_an_argument():
    def g(obj, x):
        return obj.f(x)

    cg = kiln.compile(g, backend="eager")
    a, b = Plain(), Plain()
    x = torch.randn(4)
    torch.testing.assert_close(cg(a, x), g(a, x))
    b.f = lambda x: x * 7
    torch.testing.assert_close(cg(b, x), g(b, x))
    torch.testing.assert_close(cg(a, x), g(a, x))


class Helped(torch.nn.Module):
    def helper(self, x):
        return x * 2

    def forward(self, x):
        return self.helper(x)


def test_module_method_shadowed_after_a_call():
    m = Helped()
    cm = kiln.compile(m, backend="eager")
    agree(cm, m)
    m.helper = lambda x: x * 5  # Module.__setattr__ stores it in the watched __dict__
    agree(cm, m)
    assert kiln.stats().frames_captured == 2


class Doubler(torch.nn.Module):
    def forward(self, x):
        return x * 2


@pytest.mark.parametrize("how", ["called_inside", "compiled_module"])
def test_module_forward_shadowed_after_a_call(how):
    m = Doubler()

    def g(x):
        return m(x) + 1

    eager = g if how == "called_inside" else m
    compiled = kiln.compile(eager, backend="eager")
    agree(compiled, eager)
    m.forward = lambda x: x * 5  # an instance forward wins over the class's in Module.__call__
    agree(compiled, eager)


def test_unshadowed_method_does_not_recompile():
    a = Plain()

    def g(x):
        return a.f(x)

    cg = kiln.compile(g, backend="eager")
    a.other = 1.0  # another name: nothing the trace relied on
    agree(cg, g, calls=3)
    assert kiln.stats().frames_captured == 1
