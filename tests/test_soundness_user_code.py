"""What capture knows of Python's own behaviour must hold for the user's objects: the answer is
always eager's.

A method, property, static or class method lives on the class, not on the instance the frame
reads, so the instance's guards cannot see ``A.f = other``: each (class, name) the trace looked
up is guarded once, however many instances share it (monkey-patching a library class, replacing
a module class's ``forward``, an ``autograd.Function``'s ``forward`` or ``backward``). An
instance attribute set after a call shadows the method (or non-data descriptor, or
``__getattr__`` answer) the trace found on the class. A dataclass dict that looks like
transformers' ``ModelOutput`` but has methods of its own runs them. A ``functools`` cache hands
back what it cached, even after the state its function read has changed.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

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
    """Several calls with fresh inputs, each compared with eager."""
    for _ in range(calls):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), eager(x))


# ---- code on the class changed after a call ---------------------------------------------------


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


def test_getattr_answer_then_set_on_the_class():
    class Lazy:
        def __getattr__(self, name):
            return 3.0

    a = Lazy()

    def g(x):
        return x * a.scale

    cg = kiln.compile(g, backend="eager")
    agree(cg, g)
    Lazy.scale = 7.0  # found by the class lookup now: __getattr__ no longer runs
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


# ---- functools caches hand back what they cached ---------------------------------------------

STATE = {"k": 2.0}


@pytest.mark.parametrize("decorate", [functools.lru_cache, functools.cache], ids=["lru", "cache"])
@pytest.mark.parametrize("first", ["eager", "compiled"])
def test_cached_helper_keeps_its_stale_answer(decorate, first):
    STATE["k"] = 2.0

    @decorate
    def scale(n):
        return STATE["k"] * n

    def g(x):
        return x * scale(3)

    cg = kiln.compile(g, backend="eager")
    x = torch.randn(4)
    if first == "eager":
        g(x)
    torch.testing.assert_close(cg(x), g(x))
    STATE["k"] = 5.0  # eager's cache still answers 6.0
    agree(cg, g)
    scale.cache_clear()  # now it recomputes 15.0, and caches it
    agree(cg, g)
    assert kiln.stats().frames_captured == 2


def test_cached_helper_evicted():
    STATE["k"] = 2.0

    @functools.lru_cache(maxsize=1)
    def scale(n):
        return STATE["k"] * n

    def g(x):
        return x * scale(3)

    cg = kiln.compile(g, backend="eager")
    agree(cg, g)
    STATE["k"] = 4.0
    agree(cg, g)  # still cached
    scale(4)  # evicts scale(3): the next call recomputes it
    agree(cg, g)


def test_cached_helper_on_tensors_is_traced():
    """A tensor hashes by identity: eager's cache misses for every new tensor, so tracing the
    function computes what eager computes, in the one graph."""

    @functools.lru_cache
    def double(t, n):
        return t * n

    def g(x):
        return double(x, 2) + double(x + 1, 3)

    cg = kiln.compile(g, backend="eager")
    agree(cg, g, calls=3)
    assert kiln.stats().graph_breaks == 0


def test_cached_helper_on_an_object_is_pinned_by_identity():
    class Config:
        def __init__(self, k):
            self.k = k

    @functools.lru_cache
    def width(cfg, n):
        return cfg.k * n

    a, b = Config(2.0), Config(3.0)

    def g(cfg, x):
        return x * width(cfg, 4)

    cg = kiln.compile(g, backend="eager")
    x = torch.randn(4)
    torch.testing.assert_close(cg(a, x), g(a, x))
    a.k = 10.0  # eager's cache keeps (a, 4) -> 8.0
    torch.testing.assert_close(cg(a, x), g(a, x))
    torch.testing.assert_close(cg(b, x), g(b, x))  # another object: another entry
    torch.testing.assert_close(cg(a, x), g(a, x))


def test_cached_helper_on_an_unhashable_argument_raises_as_eager():
    @functools.lru_cache
    def total(xs):
        return sum(xs)

    def g(x):
        return x * total([1, 2])

    with pytest.raises(TypeError, match="unhashable"):
        g(torch.randn(4))
    with pytest.raises(TypeError, match="unhashable"):
        kiln.compile(g, backend="eager")(torch.randn(4))


class Holder:
    def __init__(self):
        self.k = 2.0

    @functools.cached_property
    def scale(self):
        return self.k * 3

    @functools.lru_cache  # noqa: B019 (keyed by the instance, as in the programs it mimics)
    def times(self, n):
        return self.k * n


@pytest.mark.parametrize("first", ["eager", "compiled"])
def test_cached_property_and_cached_method(first):
    h = Holder()

    def g(x):
        return x * h.scale + h.times(2)

    cg = kiln.compile(g, backend="eager")
    x = torch.randn(4)
    if first == "eager":
        g(x)
    torch.testing.assert_close(cg(x), g(x))
    h.k = 10.0  # both caches keep their answers
    agree(cg, g)
    del h.scale  # the property computes again
    agree(cg, g)


# ---- ModelOutput lookalikes run their own methods --------------------------------------------


@dataclasses.dataclass
class OwnGetitem(collections.OrderedDict):
    a: torch.Tensor | None = None
    b: torch.Tensor | None = None

    def __post_init__(self):
        self["a"], self["b"] = self.a, self.b

    def __getitem__(self, k):
        key = ("a", "b")[k] if isinstance(k, int) else k
        return super().__getitem__(key) * 10


@dataclasses.dataclass
class OwnToTuple(collections.OrderedDict):
    a: torch.Tensor | None = None
    b: torch.Tensor | None = None

    def __post_init__(self):
        self["a"], self["b"] = self.a, self.b

    def to_tuple(self):
        return (self.b, self.a)


@dataclasses.dataclass
class OwnPostInit(collections.OrderedDict):
    a: torch.Tensor | None = None
    b: torch.Tensor | None = None

    def __post_init__(self):
        self["b"] = self.a * 3  # ``a`` stays an attribute only


@dataclasses.dataclass
class NoPostInit(collections.OrderedDict):
    a: torch.Tensor | None = None  # an attribute: the dict stays empty


def own_getitem(x):
    o = OwnGetitem(x, x + 1)
    return o["a"] + o[1]


def own_to_tuple(x):
    return OwnToTuple(x, x * 2).to_tuple()[0]


def own_post_init(x):
    o = OwnPostInit(x)
    return tuple(o.values()), o.a, len(o)


def no_post_init(x):
    o = NoPostInit(x)
    return len(o), o.a + 1, "a" in o


@pytest.mark.parametrize("fn", [own_getitem, own_to_tuple, own_post_init, no_post_init])
def test_model_output_lookalike_runs_its_own_methods(fn):
    cf = kiln.compile(fn, backend="eager")
    agree(cf, fn)
    assert kiln.stats().graph_breaks == 0


def test_lookalike_from_the_frame_runs_its_own_getitem():
    out = OwnGetitem(torch.randn(4), torch.randn(4))

    def g(x):
        return out["a"] + out[1] + x

    agree(kiln.compile(g, backend="eager"), g)


def test_transformers_output_with_its_own_to_tuple():
    """transformers' own subclasses override ``to_tuple`` too (CLIPOutput turns its nested
    outputs into tuples), and ``output[i]`` indexes that tuple."""
    from transformers.modeling_outputs import BaseModelOutput
    from transformers.models.clip.modeling_clip import CLIPOutput

    def g(x):
        text = BaseModelOutput(last_hidden_state=x * 2)
        o = CLIPOutput(logits_per_image=x, text_model_output=text)
        return o.to_tuple(), o[1], o["text_model_output"].last_hidden_state

    cg = kiln.compile(g, backend="eager")
    for _ in range(2):
        x = torch.randn(4)
        got, want = cg(x), g(x)
        assert type(got[0][1]) is tuple and type(got[1]) is tuple
        torch.testing.assert_close(got[0][1][0], want[0][1][0])
        torch.testing.assert_close(got[1][0], want[1][0])
        torch.testing.assert_close(got[2], want[2])
    assert kiln.stats().graph_breaks == 0
