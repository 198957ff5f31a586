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
import warnings

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


# ---- module state: parameters and buffers are graph inputs ----------------------------------


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("buf", torch.randn(4))
        self.alpha = 2.0

    def forward(self, x):
        return self.lin(x) * self.alpha + self.buf


def set_data(get, make):
    def change(m):
        get(m).data = make()

    return change


def under_no_grad(fn):
    def change(m):
        with torch.no_grad():
            fn(m)

    return change


CHANGES = {
    "data transposed": set_data(lambda m: m.lin.weight, lambda: torch.randn(4, 4).t()),
    "data other shape": set_data(lambda m: m.buf, lambda: torch.randn(1)),
    "data offset": set_data(lambda m: m.lin.weight, lambda: torch.randn(20)[4:].view(4, 4)),
    "data other dtype": set_data(lambda m: m.buf, lambda: torch.randn(4, dtype=torch.float64)),
    "requires_grad_ one": lambda m: m.lin.weight.requires_grad_(False),
    "requires_grad attr": lambda m: setattr(m.lin.bias, "requires_grad", False),
    "set_": lambda m: m.buf.set_(torch.randn(8)[::2]),
    "set_ other shape": lambda m: m.buf.set_(torch.randn(1)),
    "resize_ smaller": lambda m: m.buf.resize_(1),
    "t_": under_no_grad(lambda m: m.lin.weight.t_()),
    "as_strided_": under_no_grad(lambda m: m.lin.weight.as_strided_((4, 4), (1, 4))),
    "unsqueeze_": lambda m: m.buf.unsqueeze_(0),
    "__dict__ attribute": lambda m: m.__dict__.__setitem__("alpha", 4.0),
    "__dict__ update": lambda m: m.__dict__.update(alpha=-1.0),
    "_parameters write": lambda m: m.lin._parameters.__setitem__(
        "bias", torch.nn.Parameter(torch.randn(1))
    ),
    "_parameters none": lambda m: m.lin._parameters.__setitem__("bias", None),
    "_buffers write": lambda m: m._buffers.__setitem__("buf", torch.randn(3, 4)),
    "_modules write": lambda m: m._modules.__setitem__("lin", torch.nn.Linear(4, 4, bias=False)),
}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_module_state_changed_behind_setattr(backend, change):
    m = Net()
    c = kiln.compile(m, backend=backend)
    make = lambda: (torch.randn(3, 4),)  # noqa: E731
    agree(c, m, make=make)
    CHANGES[change](m)
    agree(c, m, make=make, calls=3)
    # the graph no longer fits (the offset is no part of it: data pointers include it)
    assert kiln.stats().frames_captured == (1 if change == "data offset" else 2)


def test_unfrozen_parameter_gets_its_gradient():
    m = Net()
    m.lin.weight.requires_grad_(False)
    c = kiln.compile(m, backend="aot_eager")
    c(torch.randn(3, 4)).sum().backward()
    assert m.lin.weight.grad is None
    m.lin.weight.requires_grad_(True)
    x = torch.randn(3, 4)
    c(x).sum().backward()
    got = m.lin.weight.grad
    m.lin.weight.grad = None
    m(x).sum().backward()
    torch.testing.assert_close(got, m.lin.weight.grad)


def test_submodule_added_later_is_watched():
    m = Net()
    c = kiln.compile(m, backend="eager")
    make = lambda: (torch.randn(3, 4),)  # noqa: E731
    agree(c, m, make=make)
    m.lin = torch.nn.Linear(4, 4)  # seen by Module.__setattr__; the new one is watched
    agree(c, m, make=make)
    m.lin.weight.data = torch.randn(4, 4).t()
    agree(c, m, make=make)
    assert kiln.stats().frames_captured == 3  # one for the new module, one for its weight
    m.lin.__dict__["training"] = False  # no effect on Linear, but must not break anything
    agree(c, m, make=make)


def test_compiled_as_argument_and_as_method():
    m = Net()

    def call(model, x):
        return model(x)

    as_argument = kiln.compile(call, backend="eager")
    as_method = kiln.compile(m.forward, backend="eager")
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(as_argument(m, x), m(x))
        torch.testing.assert_close(as_method(x), m(x))
    m.buf.set_(torch.randn(1))
    m.__dict__["alpha"] = 5.0
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(as_argument(m, x), m(x))
        torch.testing.assert_close(as_method(x), m(x))


def test_unchanged_module_state_does_not_recompile():
    m = Net()
    c = kiln.compile(m, backend="eager")
    agree(c, m, make=lambda: (torch.randn(3, 4),), calls=3)
    with torch.no_grad():
        m.lin.weight.add_(1.0)  # in-place values: the same graph
    x = torch.randn(3, 4)
    torch.testing.assert_close(c(x), m(x))
    torch.randn(4).requires_grad_()  # another tensor's metadata: nothing to re-check
    assert kiln.stats().frames_captured == 1


def test_parameters_swapped_for_equal_metadata_keep_their_entry():
    """FSDP2's cycle on every call: the full parameters swapped into the module (storage
    allocated again), the call, their storage freed, the shards swapped back. Each swap moves
    the module stamp, and the group re-checks the same metadata: one entry serves every call.
    A swap to another layout or ``requires_grad``, or a freed storage left in place, does not
    pass: eager's values (or eager's error)."""
    m = Net()
    c = kiln.compile(m, backend="kiln")
    full = dict(m.lin._parameters)
    shards = {n: torch.nn.Parameter(p.detach().flatten()[:2].clone()) for n, p in full.items()}

    def swap(to):
        for n, p in to.items():
            m.lin._parameters[n] = p

    for _ in range(4):
        swap(full)
        with torch.no_grad():
            for p in full.values():
                p.untyped_storage().resize_(p.numel() * p.element_size())
                p.copy_(torch.randn_like(p))
        agree(c, m, make=lambda: (torch.randn(3, 4),), calls=1)
        for p in full.values():
            p.untyped_storage().resize_(0)
        swap(shards)
    assert kiln.stats().frames_captured == 1
    swap(full)  # freed storages: eager's views of them raise, and so must the compiled call
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="out of bounds"):
        m(x)
    with pytest.raises(RuntimeError, match="out of bounds"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c(x)
    other = {
        "weight": torch.nn.Parameter(torch.randn(4, 4).t()),  # transposed strides
        "bias": torch.nn.Parameter(torch.randn(4), requires_grad=False),
    }
    swap(other)
    agree(c, m, make=lambda: (torch.randn(3, 4),), calls=2)
    assert c(x).requires_grad  # the weight's gradient still flows
    assert kiln.stats().graphs_compiled == 2  # the freed storage's call compiled no graph


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.randn(4))

    def forward(self, x):
        return x * self.scale.unsqueeze(0) + 1


def test_storage_resized_under_a_buffer_is_never_read_past():
    m = Scaled()
    c = kiln.compile(m, backend="kiln")
    agree(c, m, make=lambda: (torch.randn(3, 4),))
    m.scale.untyped_storage().resize_(0)
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="out of bounds"):
        m(x)
    with pytest.raises(RuntimeError, match="out of bounds"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c(x)


class Routed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))
        self.acts = torch.nn.ModuleDict({"a": torch.nn.ReLU(), "b": torch.nn.Tanh()})

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        for _, act in self.acts.items():  # reads the ModuleDict's own dict
            x = act(x)
        return x


def test_watching_a_module_costs_no_recompile():
    m = Routed()
    c = kiln.compile(m, backend="eager")
    agree(c, m, make=lambda: (torch.randn(2, 4),), calls=4)
    assert kiln.stats().frames_captured == 1
