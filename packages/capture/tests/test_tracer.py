"""A corpus of small programs: Python features x tensor ops, each captured and run.

Every program is captured with a trivial backend, compared with eager on
fresh random inputs, and checked for the number of graphs and, where given,
the exact ops in the graph.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import operator
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F

from kiln.capture import LocalSource, capture


def t(*shape):
    return torch.randn(*shape)


# --- programs ----------------------------------------------------------------
def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    return x, b.sum() < 0


def test_toy_example_first_graph(check):
    check(toy_example, (t(10), t(10)), ops=["abs", "add", "truediv", "sum", "lt"])


GLOBAL_SCALE = 3.0


def _helper(x, k=2):
    return x * k


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor

    def total(self):
        return self.a + self.b


class Counter:
    def __init__(self, start):
        self.value = start

    def step(self, x):
        return x + self.value

    @property
    def double(self):
        return self.value * 2


class Base:
    def f(self, x):
        return x + 1


class Derived(Base):
    def f(self, x):
        return super().f(x) * 2


class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + other.t)

    def __len__(self):
        return 3


def _closure_maker(scale):
    def inner(x):
        return x * scale

    return inner


_scaled = _closure_maker(4.0)


def f_closure_nonlocal(x):
    total = x

    def add(y):
        return total + y

    return add(x)


def f_recursive(x, n=3):
    if n == 0:
        return x
    return f_recursive(x * 2, n - 1)


def f_kwargs(x, *args, scale=1.0, **kw):
    out = x * scale
    for a in args:
        out = out + a
    for k in sorted(kw):
        out = out - kw[k]
    return out


def _nonlocal_counter(x):
    count = 0

    def bump():
        nonlocal count
        count += 1
        return count

    bump()
    return x * bump()


def _sorted_key(xs):
    order = sorted(range(len(xs)), key=lambda i: -i)
    return [xs[i] * i for i in order]


def _reduce_shape(x):
    return x.reshape(functools.reduce(operator.mul, x.shape, 1))


def _min_max_key(x):
    names = {"a": 3, "b": 1, "c": 2}
    lo = min(names, key=lambda k: names[k])
    hi = max(names.items(), key=lambda kv: kv[1])[0]
    return x * names[lo] + names[hi]


def _itertools(xs):
    import itertools

    total = xs[0] * 0
    for a, b in itertools.product(range(2), range(2)):
        total = total + a * b
    for x in itertools.chain(xs, [xs[0]]):
        total = total + x
    return total


class _Lazy:
    def __init__(self, t):
        self.t = t

    def __getattr__(self, name):
        if name == "doubled":
            return self.t * 2
        raise AttributeError(name)


def _getattr_hook(x):
    obj = _Lazy(x)
    a = obj.doubled if hasattr(obj, "doubled") else x
    b = getattr(obj, "missing", 5)
    return a + b


def _copies(x):
    import copy

    base = [x, 1]
    shallow = copy.copy(base)
    shallow.append(x * 2)
    cfg = copy.deepcopy({"k": [1, 2]})
    cfg["k"].append(3)
    return base, shallow, cfg


def _slides_sin_sin(x):
    y = x.sin()
    z = y.sin()
    return z


def _slides_sin_cos(x):
    y = x.sin()
    z = y.cos()
    return y, z


_REAL_PARTIAL = functools.partial(_helper, k=7)


def _number_iadd_tensor(x):
    total = 0
    total += x
    total *= 2
    return total


PROGRAMS: list[tuple[str, Any, Any, int, list[str] | None]] = [
    ("number_iadd_tensor", _number_iadd_tensor, lambda: (t(2),), 1, ["add", "imul"]),
    ("real_partial_keywords", lambda x: _REAL_PARTIAL(x), lambda: (t(2),), 1, ["mul"]),
    ("slides_sin_sin", _slides_sin_sin, lambda: (t(4),), 1, ["sin", "sin"]),
    ("slides_sin_cos", _slides_sin_cos, lambda: (t(4, 4),), 1, ["sin", "cos"]),
    ("copies", _copies, lambda: (t(2),), 1, ["mul"]),
    ("getattr_hook_rollback", _getattr_hook, lambda: (t(2),), 1, ["mul", "add"]),
    ("nonlocal_counter", _nonlocal_counter, lambda: (t(2),), 1, ["mul"]),
    ("sorted_key", _sorted_key, lambda: ([t(2), t(2), t(2)],), 1, None),
    ("reduce_shape", _reduce_shape, lambda: (t(2, 3),), 1, ["reshape"]),
    ("min_max_key", _min_max_key, lambda: (t(2),), 1, ["mul", "add"]),
    ("itertools", _itertools, lambda: ([t(2), t(2)],), 1, None),
    (
        "str_join",
        lambda x: (x * 2, "-".join(["a", "b"]), ",".join(str(i) for i in range(3))),
        lambda: (t(2),),
        1,
        None,
    ),
    ("class_attr_read", lambda x: x * _Util.factor, lambda: (t(2),), 1, ["mul"]),
    (
        "enumerate_start",
        lambda xs: [x * i for i, x in enumerate(xs, start=1)],
        lambda: ([t(2), t(2)],),
        1,
        None,
    ),
    ("dict_iter_order", lambda d: [k for k in d], lambda: ({"b": 1, "a": 2},), 0, []),
    (
        "zip_strict_lengths",
        lambda a, b: [x + y for x, y in zip(a, b)],
        lambda: ([t(1), t(1)], [t(1)]),
        1,
        ["add"],
    ),
    ("add", lambda x, y: x + y, lambda: (t(3), t(3)), 1, ["add"]),
    ("sub_mul", lambda x, y: (x - y) * 2, lambda: (t(3), t(3)), 1, ["sub", "mul"]),
    ("matmul", lambda x, y: x @ y, lambda: (t(3, 4), t(4, 5)), 1, ["matmul"]),
    ("pow_neg", lambda x: -(x**2), lambda: (t(3),), 1, ["pow", "neg"]),
    ("floordiv_mod", lambda x: (x // 2) + (x % 3), lambda: (t(4),), 1, None),
    (
        "compare_ops",
        lambda x, y: (x < y, x <= y, x > y, x >= y, x == y, x != y),
        lambda: (t(4), t(4)),
        1,
        None,
    ),
    (
        "bitwise",
        lambda x, y: (x & y) | (x ^ y),
        lambda: (torch.randint(0, 8, (4,)), torch.randint(0, 8, (4,))),
        1,
        None,
    ),
    ("invert", lambda x: ~x, lambda: (torch.rand(4) > 0.5,), 1, ["invert"]),
    (
        "torch_fns",
        lambda x: torch.relu(torch.sin(x)).exp(),
        lambda: (t(5),),
        1,
        ["sin", "relu", "exp"],
    ),
    (
        "functional",
        lambda x: F.gelu(F.softmax(x, dim=-1)),
        lambda: (t(2, 5),),
        1,
        ["softmax", "gelu"],
    ),
    (
        "methods",
        lambda x: x.view(2, 3).transpose(0, 1).contiguous().sum(0),
        lambda: (t(6),),
        1,
        ["view", "transpose", "contiguous", "sum"],
    ),
    (
        "shape_arith",
        lambda x: x.reshape(x.shape[0] * x.shape[1], -1),
        lambda: (t(2, 3, 4),),
        1,
        ["reshape"],
    ),
    (
        "size_method",
        lambda x: x.new_zeros(x.size(0), x.size(-1)),
        lambda: (t(2, 3),),
        1,
        ["new_zeros"],
    ),
    ("dim_ndim", lambda x: x.sum(x.dim() - 1) + x.ndim, lambda: (t(2, 3),), 1, ["sum", "add"]),
    (
        "dtype_device",
        lambda x: x.to(x.dtype) + torch.ones(3, device=x.device, dtype=x.dtype),
        lambda: (t(3),),
        1,
        None,
    ),
    (
        "factory",
        lambda x: x + torch.arange(4) * torch.zeros(4).fill_(2.0),
        lambda: (t(4),),
        1,
        None,
    ),
    (
        "random_ops",
        lambda x: x + torch.rand(3) + torch.randn_like(x),
        lambda: (t(3),),
        1,
        ["rand", "add", "randn_like", "add"],
    ),
    ("getitem_int", lambda x: x[0] + x[-1], lambda: (t(3, 2),), 1, None),
    ("getitem_slice", lambda x: x[1:, ::2], lambda: (t(4, 6),), 1, ["getitem"]),
    ("getitem_none_ellipsis", lambda x: x[None, ..., 0], lambda: (t(2, 3),), 1, ["getitem"]),
    (
        "getitem_tensor",
        lambda x, i: x[i],
        lambda: (t(5, 2), torch.tensor([0, 2, 4])),
        1,
        ["getitem"],
    ),
    (
        "getitem_mask",
        lambda x: x[x > 0].sum() if False else x.clamp(min=0),
        lambda: (t(5),),
        1,
        ["clamp"],
    ),
    ("setitem", lambda x: x.__setitem__(0, 1.0) or x, lambda: (t(3),), 1, None),
    ("inplace_add", lambda x: x.add_(1), lambda: (t(3),), 1, ["add_"]),
    ("iadd_local", lambda x: _iadd(x), lambda: (t(3),), 1, None),
    ("constant_fold", lambda x: x * (2**3 + math.sqrt(4)), lambda: (t(3),), 1, ["mul"]),
    ("global_constant", lambda x: x * GLOBAL_SCALE, lambda: (t(3),), 1, ["mul"]),
    (
        "helper_fn",
        lambda x: _helper(x) + _helper(x, k=3),
        lambda: (t(3),),
        1,
        ["mul", "mul", "add"],
    ),
    ("closure_global", lambda x: _scaled(x), lambda: (t(3),), 1, ["mul"]),
    ("closure_nonlocal", f_closure_nonlocal, lambda: (t(3),), 1, ["add"]),
    (
        "lambda_inner",
        lambda x: (lambda y: y * 2)(x),  # noqa: PLC3002
        lambda: (t(3),),
        1,
        ["mul"],
    ),
    ("recursion", f_recursive, lambda: (t(3),), 1, ["mul", "mul", "mul"]),
    (
        "varargs_kwargs",
        lambda x, y: f_kwargs(x, y, y, scale=2.0, b=y, a=x),
        lambda: (t(3), t(3)),
        1,
        None,
    ),
    ("partial", lambda x: functools.partial(_helper, k=5)(x), lambda: (t(3),), 1, ["mul"]),
    ("if_const_true", lambda x: x + 1 if GLOBAL_SCALE > 1 else x - 1, lambda: (t(3),), 1, ["add"]),
    ("if_shape", lambda x: x.sum() if x.shape[0] > 2 else x.mean(), lambda: (t(3),), 1, ["sum"]),
    ("if_none", lambda x, y=None: x if y is None else x + y, lambda: (t(3),), 0, []),
    ("if_not_none", lambda x, y: x if y is None else x + y, lambda: (t(3), t(3)), 1, ["add"]),
    ("for_range", lambda x: _loop_range(x), lambda: (t(3),), 1, ["add", "add", "add"]),
    (
        "for_list",
        lambda xs: _loop_list(xs),
        lambda: ([t(3), t(3), t(3)],),
        1,
        ["add", "add", "add"],
    ),
    ("while_loop", lambda x: _while(x), lambda: (t(3),), 1, ["mul", "mul", "mul", "mul"]),
    (
        "enumerate_zip",
        lambda xs, ys: _enum_zip(xs, ys),
        lambda: ([t(2), t(2)], [t(2), t(2)]),
        1,
        None,
    ),
    (
        "list_comp",
        lambda xs: torch.stack([x * 2 for x in xs]),
        lambda: ([t(2), t(2)],),
        1,
        ["mul", "mul", "stack"],
    ),
    (
        "dict_comp",
        lambda x: {k: x * v for k, v in {"a": 1, "b": 2}.items()},
        lambda: (t(2),),
        1,
        ["mul", "mul"],
    ),
    ("set_ops", lambda x: x * len({1, 2, 2, 3}), lambda: (t(2),), 1, ["mul"]),
    ("tuple_unpack", lambda x: _unpack(x), lambda: (t(2, 3),), 1, None),
    ("star_unpack", lambda x: _star(x), lambda: (t(4, 2),), 1, None),
    (
        "return_dict",
        lambda x: {"a": x + 1, "b": [x * 2, 3], "c": None},
        lambda: (t(2),),
        1,
        ["add", "mul"],
    ),
    ("return_nested", lambda x: ((x,), [x + 1, (x - 1, "s")]), lambda: (t(2),), 1, ["add", "sub"]),
    ("return_input", lambda x, y: (x, y + 1), lambda: (t(2), t(2)), 1, ["add"]),
    ("return_constant_only", lambda x: 3, lambda: (t(2),), 0, []),
    ("namedtuple_in", lambda p: p.x + p.y, lambda: (Point(t(2), t(2)),), 1, ["add"]),
    ("namedtuple_out", lambda x: Point(x, x * 2), lambda: (t(2),), 1, ["mul"]),
    ("dataclass_new", lambda x: Pair(x, x * 2).total(), lambda: (t(2),), 1, ["mul", "add"]),
    ("dataclass_in", lambda p: p.total(), lambda: (Pair(t(2), t(2)),), 1, ["add"]),
    (
        "user_object",
        lambda x, c: c.step(x) * c.double,
        lambda: (t(2), Counter(3)),
        1,
        ["add", "mul"],
    ),
    ("user_object_new", lambda x: Counter(2).step(x), lambda: (t(2),), 1, ["add"]),
    ("super_call", lambda x: Derived().f(x), lambda: (t(2),), 1, ["add", "mul"]),
    ("dunder_add", lambda x, y: (Vec(x) + Vec(y)).t, lambda: (t(2), t(2)), 1, ["add"]),
    ("dunder_len", lambda x: x * len(Vec(x)), lambda: (t(2),), 1, ["mul"]),
    (
        "isinstance",
        lambda x: x + 1 if isinstance(x, torch.Tensor) else x,
        lambda: (t(2),),
        1,
        ["add"],
    ),
    (
        "isinstance_tuple",
        lambda x, n: x * n if isinstance(n, (int, float)) else x,
        lambda: (t(2), 3),
        1,
        ["mul"],
    ),
    ("type_builtin", lambda x, n: x * 2 if type(n) is int else x, lambda: (t(2), 3), 1, ["mul"]),
    (
        "getattr_hasattr",
        lambda x: getattr(x, "shape")[0] * x if hasattr(x, "shape") else x,
        lambda: (t(2),),
        1,
        ["mul"],
    ),
    ("min_max_const", lambda x: x * max(2, 3) - min([1, 4]), lambda: (t(2),), 1, ["mul", "sub"]),
    ("sum_tensors", lambda xs: sum(xs), lambda: ([t(2), t(2), t(2)],), 1, ["add", "add", "add"]),
    ("abs_round", lambda x: x * abs(-2) * round(2.6), lambda: (t(2),), 1, ["mul", "mul"]),
    (
        "any_all",
        lambda x: x + 1 if all([True, 1]) and not any([0, False]) else x,
        lambda: (t(2),),
        1,
        ["add"],
    ),
    (
        "str_format",
        lambda x: {f"k{i}": x * i for i in range(2)},
        lambda: (t(2),),
        1,
        ["mul", "mul"],
    ),
    ("int_float_bool", lambda x: x * int(2.7) * float("1.5") * bool(3), lambda: (t(2),), 1, None),
    (
        "operator_module",
        lambda x, y: operator.mul(operator.add(x, y), 2),
        lambda: (t(2), t(2)),
        1,
        ["add", "mul"],
    ),
    (
        "reversed_sorted",
        lambda xs: [x * i for i, x in enumerate(reversed(xs))],
        lambda: ([t(2), t(2)],),
        1,
        None,
    ),
    (
        "map_filter",
        lambda xs: list(map(lambda v: v + 1, filter(lambda v: v is not None, xs))),
        lambda: ([t(2), None, t(2)],),
        1,
        ["add", "add"],
    ),
    (
        "zip_dict",
        lambda a, b: dict(zip(["x", "y"], [a, b]))["y"] * 2,
        lambda: (t(2), t(2)),
        1,
        ["mul"],
    ),
    ("list_methods", lambda x: _list_methods(x), lambda: (t(2),), 1, None),
    ("dict_methods", lambda x: _dict_methods(x), lambda: (t(2),), 1, None),
    ("dict_input", lambda d: d["a"] + d["b"], lambda: ({"a": t(2), "b": t(2)},), 1, ["add"]),
    ("kwargs_only", lambda *, x, y=2: x * y, lambda: (), 1, ["mul"]),
    ("no_grad_block", lambda x: _no_grad(x), lambda: (t(2).requires_grad_(),), 1, None),
    ("set_grad_enabled", lambda x: _set_grad(x), lambda: (t(2).requires_grad_(),), 1, None),
    ("cat_split", lambda x: torch.cat(torch.split(x, 2), dim=0), lambda: (t(4, 2),), 1, None),
    ("chunk_unpack", lambda x: _chunk(x), lambda: (t(4, 2),), 1, None),
    ("max_dim", lambda x: torch.max(x, dim=1).values + x.max(1)[1], lambda: (t(3, 4),), 1, None),
    ("where", lambda x: torch.where(x > 0, x, torch.zeros_like(x)), lambda: (t(5),), 1, None),
    (
        "einsum",
        lambda a, b: torch.einsum("ij,jk->ik", a, b),
        lambda: (t(2, 3), t(3, 4)),
        1,
        ["einsum"],
    ),
    ("tensor_iter", lambda x: [r * 2 for r in x], lambda: (t(2, 3),), 1, None),
    ("tensor_T", lambda x: x.T @ x.mT, lambda: (t(3, 3),), 1, None),
    ("f_string", lambda x: (x, f"{x.shape[0]:>3}|{GLOBAL_SCALE!r}"), lambda: (t(2),), 0, []),
    (
        "bool_ops",
        lambda x, a, b: x + 1 if (a and not b) or (a is None) else x,
        lambda: (t(2), True, False),
        1,
        ["add"],
    ),
    ("contains", lambda x, k: x * 2 if k in ("a", "b") else x, lambda: (t(2), "a"), 1, ["mul"]),
    ("chained_compare", lambda x, n: x * 2 if 0 < n < 5 else x, lambda: (t(2), 3), 1, ["mul"]),
    ("int_arg", lambda x, n: x.repeat(n, 1), lambda: (t(2), 3), 1, ["repeat"]),
    ("float_arg", lambda x, s: x * s, lambda: (t(2), 0.5), 1, ["mul"]),
    (
        "str_arg",
        lambda x, mode: x.sum() if mode == "sum" else x.mean(),
        lambda: (t(2), "sum"),
        1,
        ["sum"],
    ),
    ("slice_list", lambda xs: torch.stack(xs[1:]), lambda: ([t(2), t(2), t(2)],), 1, ["stack"]),
    ("inplace_input_mutation", lambda x: x.mul_(2).add_(1), lambda: (t(3),), 1, ["mul_", "add_"]),
    ("setitem_slice", lambda x: _setitem(x), lambda: (t(4, 4),), 1, None),
    ("aliasing", lambda x: _alias(x), lambda: (t(3),), 1, None),
    ("assert_const", lambda x: _assert(x), lambda: (t(3),), 1, ["add"]),
    ("try_finally", lambda x: _try_finally(x), lambda: (t(3),), 1, None),
    ("with_user_ctx", lambda x: _user_ctx(x), lambda: (t(3),), 1, None),
    ("tuple_compare", lambda x: x * 2 if x.shape == (3,) else x, lambda: (t(3),), 1, ["mul"]),
    ("size_unpack", lambda x: _size_unpack(x), lambda: (t(2, 3),), 1, None),
    ("torch_size_ctor", lambda x: x.new_ones(torch.Size([2, 2])), lambda: (t(2),), 1, ["new_ones"]),
    ("numel", lambda x: x / x.numel(), lambda: (t(2, 3),), 1, ["truediv"]),
    ("to_dtype", lambda x: x.to(torch.float64).half().float(), lambda: (t(3),), 1, None),
    ("finfo", lambda x: x.clamp(min=torch.finfo(x.dtype).min), lambda: (t(3),), 1, ["clamp"]),
    (
        "linear_fn",
        lambda x, w, b: F.linear(x, w, b),
        lambda: (t(2, 3), t(4, 3), t(4)),
        1,
        ["linear"],
    ),
    (
        "conv_fn",
        lambda x, w: F.conv2d(x, w, padding=1),
        lambda: (t(1, 2, 5, 5), t(3, 2, 3, 3)),
        1,
        ["conv2d"],
    ),
    ("layer_norm_fn", lambda x: F.layer_norm(x, (4,)), lambda: (t(2, 4),), 1, ["layer_norm"]),
    (
        "dropout_eval",
        lambda x: F.dropout(x, p=0.5, training=False),
        lambda: (t(4),),
        1,
        ["dropout"],
    ),
    ("nested_fn_def", lambda x: _nested_def(x), lambda: (t(2),), 1, None),
    ("default_mutable_read", lambda x, opts={"k": 2}: x * opts["k"], lambda: (t(2),), 1, ["mul"]),
    ("classmethod_static", lambda x: _Util.scale(x) + _Util.shift(x), lambda: (t(2),), 1, None),
    (
        "sum_generator_like",
        lambda xs: (
            torch.stack(list(x + 1 for x in xs)) if False else torch.stack([x + 1 for x in xs])
        ),
        lambda: ([t(2), t(2)],),
        1,
        None,
    ),
]


class _Util:
    factor = 3

    @classmethod
    def scale(cls, x):
        return x * cls.factor

    @staticmethod
    def shift(x):
        return x + 1


def _nested_def(x):
    def g(y, z=2):
        return y * z

    h = lambda y: g(y) + 1  # noqa: E731
    return h(x)


def _size_unpack(x):
    a, b = x.shape
    return x.view(b, a)


def _try_finally(x):
    try:
        y = x + 1
    finally:
        z = 2
    return y * z


class _Ctx:
    def __enter__(self):
        return 2

    def __exit__(self, *exc):
        return False


def _user_ctx(x):
    with _Ctx() as k:
        y = x * k
    return y


def _assert(x):
    assert x.dim() == 1, "needs 1-d"
    return x + 1


def _alias(x):
    y = x
    y += 1
    return x * 2, y


def _setitem(x):
    x[1:3, :] = 0.0
    x[0] = x[0] * 2
    return x


def _iadd(x):
    y = x * 1
    y += 2
    return y


def _loop_range(x):
    for i in range(3):
        x = x + i
    return x


def _loop_list(xs):
    out = xs[0]
    for x in xs:
        out = out + x
    return out


def _while(x):
    i = 0
    while i < 4:
        x = x * 1.5
        i += 1
    return x


def _enum_zip(xs, ys):
    out = []
    for i, (a, b) in enumerate(zip(xs, ys)):
        out.append(a * i + b)
    return out


def _unpack(x):
    a, b = x
    (c, d), e = (a, b), x
    return c + d + e[0]


def _star(x):
    first, *rest = x
    return first + sum(rest)


def _list_methods(x):
    out = [x]
    out.append(x + 1)
    out.extend([x * 2, x * 3])
    out.insert(0, x - 1)
    last = out.pop()
    out.reverse()
    return out, last, len(out)


def _dict_methods(x):
    d = {"a": x}
    d["b"] = x + 1
    d.update(c=x * 2)
    v = d.get("zz", x) + d.pop("a")
    d.setdefault("e", 3)
    return d, v, list(d.keys()), "b" in d


def _no_grad(x):
    with torch.no_grad():
        y = x * 2
    z = x * 3
    return y, z, y.requires_grad, z.requires_grad


def _set_grad(x):
    with torch.set_grad_enabled(False):
        y = x * 2
    return y, y.requires_grad


def _chunk(x):
    a, b = x.chunk(2)
    return a - b


@pytest.mark.parametrize(
    "fn,make_args,graphs,ops", [p[1:] for p in PROGRAMS], ids=[p[0] for p in PROGRAMS]
)
def test_program(check, fn, make_args, graphs, ops):
    args = make_args()
    if fn.__code__.co_kwonlyargcount and not args:
        check(fn, (), {"x": t(2)}, graphs=graphs, ops=ops)
    else:
        check(fn, args, graphs=graphs, ops=ops)


def test_is_compiling_is_true_while_capturing():
    def fn(x):
        return x + 1 if torch.compiler.is_compiling() else x - 1

    r = capture(fn, (t(2),), {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f)
    assert [n.target.__name__ for n in r.graphs[0].graph.nodes if n.op == "call_function"] == [
        "add"
    ]


class _MyError(Exception):
    pass


def _try_keyerror(x, d):
    try:
        return x * d["missing"]
    except KeyError:
        return x + 1


def _try_raise_custom(x):
    try:
        if x.shape[0] == 3:
            raise _MyError("three")
        y = x
    except _MyError as e:
        y = x * 2 if isinstance(e, _MyError) else x
    return y


def _try_attribute(x, obj):
    try:
        scale = obj.missing
    except AttributeError:
        scale = 3
    return x * scale


def _try_nested(x):
    try:
        try:
            raise ValueError("inner")
        except KeyError:
            return x
    except ValueError:
        return x - 1


def _try_else_finally(x):
    out = x
    try:
        out = out + 1
    except Exception:
        out = out * 0
    else:
        out = out * 2
    finally:
        out = out - 3
    return out


def _inner_raises(x):
    raise IndexError("deep")


def _catch_from_inlined(x):
    try:
        return _inner_raises(x)
    except IndexError:
        return x * 5


def _with_exception_in_block(x):
    with torch.no_grad():
        try:
            y = x * 2
            raise RuntimeError
        except RuntimeError:
            y = y + 1
    return y, y.requires_grad


def _stop_iteration(xs):
    it = iter(xs)
    first = next(it)
    second = next(it, None)
    try:
        next(it)
        third = 1
    except StopIteration:
        third = 0
    return first * 2, second, third


EXCEPTION_PROGRAMS = [
    ("keyerror", _try_keyerror, lambda: (t(2), {"a": 1}), ["add"]),
    ("custom_error", _try_raise_custom, lambda: (t(3),), ["mul"]),
    ("attribute_error", _try_attribute, lambda: (t(2), Counter(1)), ["mul"]),
    ("nested", _try_nested, lambda: (t(2),), ["sub"]),
    ("else_finally", _try_else_finally, lambda: (t(2),), ["add", "mul", "sub"]),
    ("from_inlined", _catch_from_inlined, lambda: (t(2),), ["mul"]),
    ("in_no_grad", _with_exception_in_block, lambda: (t(2).requires_grad_(),), None),
    ("stop_iteration", _stop_iteration, lambda: ([t(2)],), ["mul"]),
]


@pytest.mark.parametrize(
    "fn,make_args,ops", [p[1:] for p in EXCEPTION_PROGRAMS], ids=[p[0] for p in EXCEPTION_PROGRAMS]
)
def test_exceptions_caught_in_traced_code(check, fn, make_args, ops):
    check(fn, make_args(), ops=ops)


def test_checkpoint_rollback_drops_ops():
    from kiln.capture.graph import OutputGraph
    from kiln.capture.tracer import Tracer
    from kiln.capture.values.base import ConstantValue

    def fn(x):
        return x

    out = OutputGraph()
    tr = Tracer(fn.__code__, fn.__globals__, out, f_locals={}, cells={})
    x = out.add_input(LocalSource("x"), t(2))
    cp = tr.checkpoint()
    tr.push(ConstantValue(1))
    out.create_node("call_function", torch.relu, (x.node,), {}, x.fake)
    tr.rollback(cp)
    assert tr.stack == [] and [n.op for n in out.graph.nodes] == ["placeholder"]


# --- edge cases of Python semantics --------------------------------------------
_W = torch.randn(3)


def _edge_late_binding(x):
    fs = [lambda: i for i in range(3)]
    return [x * f() for f in fs]


def _edge_comp_cell(x):
    k = 2
    return [x * k for _ in range(2)], {j: x + j for j in range(2)}


def _edge_nested_comp(x):
    return [[x * i * j for j in range(2)] for i in range(2)]


def _edge_walrus(x):
    if (n := x.shape[0]) > 1:
        return x * n
    return x


def _edge_global_tensor(x):
    return x + _W


def _edge_star_call(x):
    args = (x, 1)
    kw = {"alpha": 2}
    return torch.add(*args, **kw)


def _edge_tensor_bool_method(x):
    return x.any() & x.all()


def _edge_slice_assign_list(x):
    items = [x, x, x]
    items[1:] = [x * 2]
    return items


def _edge_type_eq(x):
    return x * 2 if type(x) == torch.Tensor else x  # noqa: E721


def _edge_str_methods(x):
    s = "Hello"
    return x * len(s.lower().replace("l", "")), s.startswith("He")


def _edge_tuple_in(x):
    return x * 2 if "a" in ("a", "b") and 3 not in [1, 2] else x


def _edge_shape_list(x):
    return x.view(list(x.shape)[::-1])


def _edge_cond_expr_none(x, y=None):
    y = y if y is not None else torch.zeros_like(x)
    return x + y


_EDGE_CLOSURE_W = torch.randn(3)


def _edge_closure_tensor(x):
    w = _EDGE_CLOSURE_W

    def f(y):
        return y * w

    return f(x)


EDGE_CASES = [
    _edge_late_binding,
    _edge_comp_cell,
    _edge_nested_comp,
    _edge_walrus,
    _edge_global_tensor,
    _edge_star_call,
    _edge_tensor_bool_method,
    _edge_slice_assign_list,
    _edge_type_eq,
    _edge_str_methods,
    _edge_tuple_in,
    _edge_shape_list,
    _edge_cond_expr_none,
    _edge_closure_tensor,
]


@pytest.mark.parametrize("fn", EDGE_CASES, ids=[f.__name__ for f in EDGE_CASES])
def test_edge_case(check, fn):
    check(fn, (t(3),))


class _Color(enum.Enum):
    RED = 1
    BLUE = 2


def test_enum_lookup_and_compare(check):
    def fn(x, c):
        return x * 2 if _Color(1) is c else x

    check(fn, (t(2), _Color.RED), ops=["mul"])


def test_tensor_subclass_input_is_traced_and_its_type_kept():
    class Tagged(torch.Tensor):
        pass

    x = t(2).as_subclass(Tagged)
    result = capture(
        lambda x: x + 1,
        (x,),
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
        fullgraph=True,
    )
    out = result.function(x)
    assert type(out) is Tagged and len(result.graphs) == 1
    torch.testing.assert_close(out.as_subclass(torch.Tensor), x.as_subclass(torch.Tensor) + 1)
