"""Hypothesis strategies for random small PyTorch programs, built as source text.

A program is the text of a module holding ``def f(x, y, s)`` (two tensors and a Python float)
plus a few module globals, so a failure prints as a program a person can read and run. The
generator tracks every variable's shape (as symbols over the inputs' sizes ``n`` and ``m``),
dtype and a few flags, so that nearly every program it writes runs in eager; the rest are
filtered by running eager first (see ``differential``).

The flags keep the comparison meaningful rather than noisy: a float computed by arithmetic is
*inexact* (fused code may round differently), and nothing discrete (``==``, ``floor``,
``long()``, ``argmax``, a data-dependent branch) is applied to it when it went through bfloat16,
where one rounding step is large enough to flip the answer.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from hypothesis import strategies as st

from .harness import Call

DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "bool": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}
FLOATS = ("f32", "f64", "bf16")
BACKENDS = ("kiln", "aot_eager", "eager")


@dataclass(frozen=True)
class Var:
    """A tensor variable of the program as the generator knows it."""

    name: str
    shape: tuple[str, ...]  # one symbol per dim: "n", "m", "1", "2", or a fresh one ("u3")
    dtype: str
    input_view: bool = False  # the input itself or a view of it (in-place on it reaches the caller)
    lossy: bool = False  # went through bfloat16: no discrete op may read it
    exact: bool = True  # not the result of float arithmetic


@dataclass
class Env:
    """What the generator has defined so far, and the lines written."""

    grad: bool
    tensors: list[Var] = field(default_factory=list)
    pyvars: list[str] = field(default_factory=list)  # Python numbers: "s" and derived ones
    containers: list[str] = field(default_factory=list)  # lists of tensors of one kind
    container_kind: dict[str, Var] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    fresh: itertools.count[int] = field(default_factory=itertools.count)
    uses_globals: bool = False
    counts: bool = False  # writes the global COUNT (declared at the top of f)
    funcs: list[str] = field(default_factory=list)  # closures t -> same shape, called later

    def name(self, prefix: str = "v") -> str:
        return f"{prefix}{next(self.fresh)}"


def result_dtype(a: Var, b: Var | float | int) -> str:
    """torch's promotion for ``a op b`` (a 0-d tensor does not promote a tensor of more dims)."""
    ta = torch.empty((1,) * len(a.shape), dtype=DTYPES[a.dtype])
    other: Any = b
    if isinstance(b, Var):
        other = torch.empty((1,) * len(b.shape), dtype=DTYPES[b.dtype])
    return NAMES[torch.result_type(ta, other)]


def broadcast(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...] | None:
    """The broadcast shape of two symbolic shapes, or None when they may not broadcast."""
    out: list[str] = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else "1"
        db = b[-i] if i <= len(b) else "1"
        if da == db or db == "1":
            out.append(da)
        elif da == "1":
            out.append(db)
        else:
            return None
    return tuple(reversed(out))


def _float(dtype: str) -> str:
    return dtype if dtype in FLOATS else "f32"


@st.composite
def _tensor(draw: st.DrawFn, env: Env, pred: Any = None) -> Var:
    pool = [v for v in env.tensors if pred is None or pred(v)]
    if not pool:
        pool = [env.tensors[0]]
    # Recent variables are likelier: programs then read as chains rather than fans.
    index = draw(st.integers(0, len(pool) - 1))
    if draw(st.booleans()):
        index = max(index, len(pool) - 2)
    return pool[index]


def _derived(v: Var, name: str, **changes: Any) -> Var:
    return replace(v, name=name, input_view=False, **changes)


def _fresh_dim(env: Env) -> str:
    return f"u{next(env.fresh)}"


# ---- single statements: each defines a new variable (or mutates one) --------------------------


@st.composite
def unary(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env, lambda v: v.dtype != "bool"))
    op = draw(
        st.sampled_from(
            [
                "torch.sin({a})",
                "{a}.cos()",
                "torch.tanh({a})",
                "{a}.sigmoid()",
                "torch.exp({a}.clamp(-3, 3))",
                "torch.log1p({a}.abs())",
                "{a}.abs().sqrt()",
                "torch.erf({a})",
                "{a}.square()",
                "torch.relu({a})",
                "{a}.abs()",
                "-{a}",
                "torch.nn.functional.gelu({a})",
                "torch.nn.functional.silu({a})",
                "torch.reciprocal({a}.abs() + 1)",
                "torch.rsqrt({a}.abs() + 1)",
            ]
        )
    )
    dtype = a.dtype if op in ("torch.relu({a})", "{a}.abs()", "-{a}", "{a}.square()") else None
    if dtype is None:
        dtype = _float(a.dtype)
        if "gelu" in op or "silu" in op:
            dtype = a.dtype  # float-only: raises on integers, as eager does
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name)}")
    env.tensors.append(_derived(a, name, dtype=dtype, exact=dtype not in FLOATS))


@st.composite
def binary(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env, lambda v: v.dtype != "bool"))
    b = draw(_tensor(env, lambda v: v.dtype != "bool" and broadcast(a.shape, v.shape) is not None))
    shape = broadcast(a.shape, b.shape)
    if shape is None:
        b = a
        shape = a.shape
    op = draw(
        st.sampled_from(
            [
                "{a} + {b}",
                "{a} - {b}",
                "{a} * {b}",
                "{a} / ({b}.abs() + 1)",
                "torch.maximum({a}, {b})",
                "torch.minimum({a}, {b})",
                "torch.where({a} > {b}, {a}, {b})",
                "torch.lerp({a}, {b}, 0.25)",
                "torch.atan2({a}, {b})",
                "{a} * {b} + {a}",
            ]
        )
    )
    dtype = result_dtype(a, b)
    if "/" in op or "atan2" in op:
        dtype = _float(dtype)
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name, b=b.name)}")
    env.tensors.append(Var(name, shape, dtype, lossy=a.lossy or b.lossy, exact=dtype not in FLOATS))


@st.composite
def scalar_op(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env, lambda v: v.dtype != "bool"))
    scalar = draw(st.sampled_from([*env.pyvars, "2", "0.5", "-1.5", "G"]))
    if scalar == "G":
        env.uses_globals = True
    op = draw(st.sampled_from(["{a} * {s}", "{a} + {s}", "{s} - {a}", "{a} / ({s} + 3.5)"]))
    pyfloat = scalar not in ("2",) and not scalar.startswith("k")
    dtype = a.dtype if a.dtype in FLOATS else ("f32" if pyfloat or "/" in op else a.dtype)
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name, s=scalar)}")
    env.tensors.append(_derived(a, name, dtype=dtype, exact=dtype not in FLOATS))


@st.composite
def compare(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env, lambda v: not v.lossy and v.dtype != "bool"))
    b = draw(
        _tensor(
            env,
            lambda v: not v.lossy and v.dtype != "bool" and broadcast(a.shape, v.shape) is not None,
        )
    )
    shape = broadcast(a.shape, b.shape) or a.shape
    if broadcast(a.shape, b.shape) is None:
        b = a
    ops = ["{a} > {b}", "{a} <= {b}", "{a} > 0", "{a}.abs() < 0.5"]
    if a.exact and b.exact:
        ops += ["{a} == {b}", "{a} != {b}"]
    op = draw(st.sampled_from(ops))
    name = env.name("c")
    env.lines.append(f"{name} = {op.format(a=a.name, b=b.name)}")
    env.tensors.append(Var(name, shape, "bool"))
    if draw(st.booleans()):
        # Use the mask at once: where, masked_fill, logical ops, counting.
        c = env.tensors[-1]
        t = draw(_tensor(env, lambda v: v.dtype != "bool" and v.shape == c.shape))
        use = draw(
            st.sampled_from(
                [
                    ("torch.where({c}, {t}, torch.zeros_like({t}))", t.dtype, t.shape),
                    ("{t}.masked_fill({c}, -1)", t.dtype, t.shape),
                    ("(~{c}) | ({t} > 1)", "bool", t.shape),
                    ("{c}.sum(-1)" if c.shape else "{c}.long()", "i64", c.shape[:-1]),
                    ("{c}.float() * {t}", _float(t.dtype), t.shape),
                    ("{c}.logical_xor({c}.logical_not())", "bool", c.shape),
                ]
            )
        )
        if t.shape != c.shape:
            return
        name2 = env.name()
        env.lines.append(f"{name2} = {use[0].format(c=c.name, t=t.name)}")
        env.tensors.append(Var(name2, use[2], use[1], lossy=t.lossy, exact=use[1] not in FLOATS))


@st.composite
def reduction(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env, lambda v: len(v.shape) >= 1))
    if not a.shape:
        return
    dim = draw(st.integers(-len(a.shape), len(a.shape) - 1))
    rest = tuple(s for i, s in enumerate(a.shape) if i != dim % len(a.shape))
    keep = tuple("1" if i == dim % len(a.shape) else s for i, s in enumerate(a.shape))
    numeric = a.dtype != "bool"
    choices: list[tuple[str, tuple[str, ...], str]] = [
        ("{a}.sum()", (), a.dtype if a.dtype in FLOATS else "i64"),
        (f"{{a}}.sum({dim})", rest, a.dtype if a.dtype in FLOATS else "i64"),
        (f"{{a}}.sum(dim={dim}, keepdim=True)", keep, a.dtype if a.dtype in FLOATS else "i64"),
        (f"{{a}}.amax({dim})", rest, a.dtype),
        (f"{{a}}.amin(dim={dim}, keepdim=True)", keep, a.dtype),
        (f"{{a}}.any({dim})", rest, "bool"),
        ("{a}.all()", (), "bool"),
    ]
    if numeric:
        choices += [
            (f"{{a}}.max(dim={dim}).values", rest, a.dtype),
            (f"{{a}}.cumsum({dim})", a.shape, a.dtype if a.dtype in FLOATS else "i64"),
        ]
    if a.dtype in FLOATS:
        choices += [
            (f"{{a}}.mean({dim})", rest, a.dtype),
            ("{a}.mean()", (), a.dtype),
            (f"torch.softmax({{a}}, {dim})", a.shape, a.dtype),
            (f"torch.logsumexp({{a}}, {dim})", rest, a.dtype),
            ("{a}.norm()", (), a.dtype),
            (f"{{a}}.var({dim})", rest, a.dtype),
            (f"{{a}}.prod({dim})", rest, a.dtype),
        ]
    if not a.lossy and numeric:
        choices += [
            (f"{{a}}.argmax({dim})", rest, "i64"),
            ("{a}.argmin()", (), "i64"),
            (f"{{a}}.max(dim={dim})[1]", rest, "i64"),
        ]
    op, shape, dtype = draw(st.sampled_from(choices))
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name)}")
    exact = dtype not in FLOATS or "amax" in op or "amin" in op or ".values" in op
    env.tensors.append(Var(name, shape, dtype, lossy=a.lossy, exact=exact and a.exact))


@st.composite
def matmul(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env, lambda v: len(v.shape) == 2 and v.dtype in FLOATS))
    if len(a.shape) != 2:
        return
    p, q = a.shape
    same = [v for v in env.tensors if v.shape == a.shape and v.dtype == a.dtype]
    b = draw(st.sampled_from(same)) if same else a
    op, shape = draw(
        st.sampled_from(
            [
                ("{a} @ {b}.t()", (p, p)),
                ("{a}.t() @ {b}", (q, q)),
                ("torch.mm({a}, {b}.transpose(0, 1))", (p, p)),
                ("torch.einsum('ij,ij->i', {a}, {b})", (p,)),
                ("{a} @ {b}[0]", (p,)),
                ("torch.bmm({a}.unsqueeze(0), {b}.t().unsqueeze(0))[0]", (p, p)),
            ]
        )
    )
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name, b=b.name)}")
    env.tensors.append(Var(name, shape, a.dtype, lossy=a.lossy, exact=False))


@st.composite
def view_op(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env))
    nd = len(a.shape)
    choices: list[tuple[str, tuple[str, ...]]] = [
        ("{a}.unsqueeze(0)", ("1", *a.shape)),
        ("{a}[None]", ("1", *a.shape)),
        ("{a}.reshape(-1)", ("*".join(a.shape) or "1",)),
        ("{a}.clone()", a.shape),
        ("{a}.detach()", a.shape),
        ("{a}.contiguous()", a.shape),
    ]
    if nd >= 1:
        fresh = _fresh_dim(env)
        choices += [
            ("{a}[0]", a.shape[1:]),
            ("{a}[-1]", a.shape[1:]),
            ("{a}[1:]", (fresh, *a.shape[1:])),
            ("{a}[::2]", (fresh, *a.shape[1:])),
            ("{a}.narrow(0, 0, 1)", ("1", *a.shape[1:])),
            ("{a}.flip(0)", a.shape),
            ("torch.roll({a}, 1, 0)", a.shape),
            ("{a}.unsqueeze(-1)", (*a.shape, "1")),
            ("{a}.view(-1)", ("*".join(a.shape),)),
            ("torch.cat([{a}, {a}], 0)", (fresh, *a.shape[1:])),
            ("torch.stack([{a}, {a} * 2])", ("2", *a.shape)),
            ("{a}.expand(2, *{a}.shape)", ("2", *a.shape)),
            ("{a}.repeat(2, *([1] * {a}.dim()))", ("2", *a.shape)),
        ]
    if nd == 2:
        p, q = a.shape
        choices += [
            ("{a}.t()", (q, p)),
            ("{a}.T", (q, p)),
            ("{a}.transpose(0, 1)", (q, p)),
            ("{a}.permute(1, 0)", (q, p)),
            ("{a}.reshape({a}.shape[1], {a}.shape[0])", (q, p)),
            ("{a}[:, 0]", (p,)),
            ("{a}[..., -1]", (p,)),
            ("{a}[:, 1:]", (p, _fresh_dim(env))),
            ("{a}.select(1, 0)", (p,)),
            ("{a}.flatten()", (f"{p}*{q}",)),
            ("{a}.unsqueeze(1).expand(-1, 3, -1)", (p, "3", q)),
            ("{a}.t().contiguous().view({a}.shape[1], -1)", (q, p)),
            ("torch.cat([{a}, {a}.flip(1)], 1)", (p, _fresh_dim(env))),
        ]
        if p == q:
            choices += [("{a}.diagonal()", (p,)), ("{a}.triu()", a.shape)]
    if nd == 3:
        choices += [("{a}.permute(2, 0, 1)", (a.shape[2], a.shape[0], a.shape[1]))]
    idx = [v for v in env.tensors if v.dtype == "i64" and len(v.shape) == 1 and not v.lossy]
    if nd >= 1 and idx and a.shape[0] in ("n", "m"):
        i = draw(st.sampled_from(idx))
        # An argmax over dim 0 of an (n, ...) tensor indexes an n-sized dim: always in range.
        choices += [(f"{{a}}[{i.name}.clamp(0, {{a}}.shape[0] - 1)]", (i.shape[0], *a.shape[1:]))]
    op, shape = draw(st.sampled_from(choices))
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name)}")
    is_view = not any(k in op for k in ("clone", "contiguous", "cat", "stack", "repeat", "flip"))
    is_view = is_view and "roll" not in op and "triu" not in op and "reshape" not in op
    env.tensors.append(replace(a, name=name, shape=shape, input_view=a.input_view and is_view))


@st.composite
def masked_select(draw: st.DrawFn, env: Env) -> None:
    """A data-dependent output shape: boolean-mask indexing and nonzero."""
    a = draw(_tensor(env, lambda v: v.dtype != "bool" and not v.lossy and len(v.shape) >= 1))
    if not a.shape or a.dtype == "bool":
        return
    op = draw(
        st.sampled_from(["{a}[{a} > 0]", "{a}[({a} > 0).nonzero()[:, 0]]", "{a}.nonzero()[:, 0]"])
    )
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name)}")
    dtype = "i64" if op.startswith("{a}.nonzero") else a.dtype
    shape: tuple[str, ...] = (_fresh_dim(env),)
    if "[:, 0]]" in op:
        shape = (_fresh_dim(env), *a.shape[1:])
    env.tensors.append(Var(name, shape, dtype, lossy=a.lossy, exact=a.exact))


@st.composite
def dtype_change(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env))
    targets = ["f64", "f32", "bf16"]
    if not a.lossy and a.exact:
        targets += ["i64", "bool"]
    target = draw(st.sampled_from(targets))
    spelling = draw(
        st.sampled_from(
            {
                "f64": ["{a}.to(torch.float64)", "{a}.double()"],
                "f32": ["{a}.float()", "{a}.to(dtype=torch.float32)"],
                "bf16": ["{a}.to(torch.bfloat16)", "{a}.bfloat16()"],
                "i64": ["{a}.long()", "{a}.to(torch.int64)"],
                "bool": ["{a}.bool()", "{a}.to(torch.bool)"],
            }[target]
        )
    )
    name = env.name()
    env.lines.append(f"{name} = {spelling.format(a=a.name)}")
    lossy = a.lossy or (target == "bf16" and a.dtype != "bf16")
    env.tensors.append(_derived(a, name, dtype=target, lossy=lossy))


def _inplace_target(env: Env) -> Any:
    """Which variables an in-place op may write: under autograd not a leaf input or its view."""
    return lambda v: not (env.grad and v.input_view)


@st.composite
def inplace(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env, _inplace_target(env)))
    if env.grad and a.input_view:
        return
    same = [v for v in env.tensors if broadcast(a.shape, v.shape) == a.shape]
    b = draw(st.sampled_from(same)) if same else a
    numeric = a.dtype != "bool"
    choices = ["{a}.zero_()", "{a}.fill_(1)", "{a}.copy_({b})"]
    if numeric:
        choices += ["{a}.add_(1)", "{a}.mul_(2)", "{a}.clamp_(-1, 1)", "{a}.neg_()"]
        if torch.can_cast(DTYPES[result_dtype(a, b)], DTYPES[a.dtype]):
            choices += ["{a}.add_({b})", "{a}.mul_({b})", "{a} += {b}", "{a}.sub_({b}, alpha=2)"]
        if a.dtype in FLOATS:
            choices += ["{a}.sin_()", "{a}.sigmoid_()", "{a} *= 0.5"]
    if a.shape:
        choices += ["{a}[0] = 0", "{a}[-1] = {a}[0]"]
        if len(a.shape) == 2:
            choices += ["{a}[:, 0] = 1", "{a}[1:] += 1", "{a}.t()[0].fill_(2)"]
        if not a.lossy and numeric:
            choices += ["{a}[{a} > 0] = 0"]
    op = draw(st.sampled_from(choices))
    env.lines.append(op.format(a=a.name, b=b.name))
    # Every variable sharing a's storage changed too; the generator need not know which.
    env.tensors = [
        replace(v, exact=v.exact and v.dtype not in FLOATS) if v.name == a.name else v
        for v in env.tensors
    ]


# ---- Python values, containers, closures, globals -------------------------------------------


@st.composite
def python_value(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env))
    choices = ["{a}.dim() + 1", "{a}.numel() % 4", "len({a}.shape)", "{s} * 2 + 1", "G * {s}"]
    if a.shape:
        choices += ["{a}.shape[0]", "{a}.size(-1)", "len({a})", "max({a}.shape)"]
    if not a.lossy and a.dtype != "bool":
        choices += ["float({a}.sum())", "{a}.max().item()", "int(({a} > 0).sum())"]
    scalar = draw(st.sampled_from(env.pyvars))
    op = draw(st.sampled_from(choices))
    if "G" in op:
        env.uses_globals = True
    name = env.name("k")
    env.lines.append(f"{name} = {op.format(a=a.name, s=scalar)}")
    env.pyvars.append(name)


@st.composite
def container(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env))
    group = [v for v in env.tensors if v.shape == a.shape and v.dtype == a.dtype]
    members = draw(st.lists(st.sampled_from(group), min_size=1, max_size=3))
    names = ", ".join(v.name for v in members)
    lst, out = env.name("L"), env.name()
    kind = draw(st.integers(0, 7))
    joined = replace(a, input_view=False, exact=a.exact and a.dtype not in FLOATS)
    if kind == 0:
        env.lines += [f"{lst} = [{names}]", f"{out} = torch.stack({lst})"]
        var = replace(joined, name=out, shape=(_fresh_dim(env), *a.shape))
    elif kind == 1:
        env.lines += [f"{lst} = [t * 2 for t in ({names},)]", f"{out} = {lst}[-1]"]
        var = replace(joined, name=out)
    elif kind == 2:
        env.lines += [
            f"{lst} = {{'first': {members[0].name}, 'rest': [{names}]}}",
            f"{out} = {lst}['first']",
            f"for t in {lst}['rest']:",
            f"    {out} = {out} + t",
        ]
        var = replace(joined, name=out, dtype=a.dtype if a.dtype != "bool" else "i64")
    elif kind == 3:
        env.lines += [
            f"{lst} = []",
            f"for i in range({len(members) + 1}):",
            f"    {lst}.append({a.name} * i)",
            f"{out} = sum({lst})",
        ]
        var = replace(joined, name=out, dtype=a.dtype if a.dtype != "bool" else "i64")
    elif kind == 4:
        env.lines += [
            f"{lst} = ({names}, {a.name})",
            f"*_, {out} = {lst}",
        ]
        var = replace(a, name=out)
    elif kind == 5:
        env.lines += [
            f"{lst} = {{f'k{{i}}': t for i, t in enumerate([{names}])}}",
            f"{out} = {lst}['k0'] if len({lst}) > 1 else {lst}[list({lst})[-1]]",
        ]
        var = replace(a, name=out)
    elif kind == 6:
        env.lines += [
            f"{lst} = [{names}]",
            f"{lst}.reverse()",
            f"{out} = torch.cat([t.reshape(-1) for t in {lst}])",
        ]
        var = replace(joined, name=out, shape=(_fresh_dim(env),))
    else:
        env.lines += [
            f"{lst} = {{}}",
            f"for i, t in enumerate([{names}]):",
            f"    {lst}.setdefault(i % 2, []).append(t)",
            f"{out} = {lst}[0][-1]",
        ]
        var = replace(a, name=out)
    env.tensors.append(var)
    env.containers.append(lst)


@st.composite
def closure(draw: st.DrawFn, env: Env) -> None:
    a = draw(_tensor(env, lambda v: v.dtype in FLOATS))
    b = draw(_tensor(env, lambda v: v.dtype in FLOATS and broadcast(a.shape, v.shape) == a.shape))
    if broadcast(a.shape, b.shape) != a.shape or a.dtype not in FLOATS:
        b = a
    g, out = env.name("g"), env.name()
    scalar = draw(st.sampled_from(env.pyvars))
    kind = draw(st.integers(0, 5))
    dtype = result_dtype(a, b)
    if kind == 0:
        env.lines += [
            f"def {g}(t):",
            f"    return t * {b.name} + {scalar}",
            f"{out} = {g}({a.name})",
        ]
    elif kind == 1:
        env.lines += [f"{g} = lambda t, u=2: torch.sin(t) * u", f"{out} = {g}({a.name})"]
        dtype = a.dtype
    elif kind == 2:
        env.lines += [
            "calls = 0",
            f"def {g}(t):",
            "    nonlocal calls",
            "    calls += 1",
            "    return t + calls",
            f"{out} = {g}({g}({a.name}))",
        ]
        dtype = a.dtype
    elif kind == 3:
        env.lines += [
            f"def {g}(t):",
            "    def inner(u):",
            f"        return u * {b.name}",
            "    return inner(t) + inner(t.cos())",
            f"{out} = {g}({a.name})",
        ]
    elif kind == 4:
        env.uses_globals = True
        env.lines += [f"{out} = helper({a.name}, {b.name})"]
    else:
        env.lines += [
            f"{g} = [lambda t, i=i: t * i for i in range(3)]",
            f"{out} = sum(h({a.name}) for h in {g})",
        ]
        dtype = a.dtype
    env.tensors.append(Var(out, a.shape, dtype, lossy=a.lossy or b.lossy, exact=False))


@st.composite
def global_effect(draw: st.DrawFn, env: Env) -> None:
    env.uses_globals = True
    a = draw(_tensor(env))
    kind = draw(st.integers(0, 4))
    if kind == 4:
        env.lines += ["GT.mul_(1.5)"]
        return
    if kind == 0:
        env.counts = True
        env.lines += ["COUNT += 1"]
    elif kind == 1:
        env.lines += [f"LOG.append({a.name}.dim())"]
    elif kind == 2 and a.dtype in FLOATS:
        out = env.name()
        env.lines += [f"{out} = {a.name} * GT + G"]
        env.tensors.append(_derived(a, out, exact=False))
    else:
        out = env.name()
        env.lines += [f"{out} = {a.name} if CONFIG['flag'] else {a.name} + 1"]
        env.tensors.append(
            _derived(a, out, dtype=a.dtype if a.dtype != "bool" else "i64", exact=False)
        )


# ---- blocks: bodies keep every variable's shape and dtype ------------------------------------


def _update(env: Env, v: Var, choice: int, extra: str) -> str:
    """A statement rewriting ``v`` with a value of the same shape and dtype."""
    if v.dtype == "bool":
        return f"{v.name} = ~{v.name}" if choice % 2 else f"{v.name} = {v.name} | {v.name}"
    floats = [
        f"{v.name} = {v.name} * 0.5",
        f"{v.name} = torch.sin({v.name})",
        f"{v.name} = {v.name} - {extra}",
        f"{v.name} = ({v.name} + 1).abs()",
    ]
    ints = [f"{v.name} = {v.name} + 1", f"{v.name} = {v.name} * 2", f"{v.name} = -{v.name}"]
    if not (env.grad and v.input_view):
        ints.append(f"{v.name}.add_(1)")
        floats.append(f"{v.name}.mul_(0.5)")
    pool = floats if v.dtype in FLOATS else ints
    return pool[choice % len(pool)]


@st.composite
def block(draw: st.DrawFn, env: Env) -> None:
    targets = draw(
        st.lists(st.sampled_from(env.tensors[-4:]), min_size=1, max_size=2, unique_by=str)
    )
    conds = [
        ("x.shape[0] > 2", False),
        ("y.dim() == 2 and x.size(1) % 2 == 0", False),
        ("s > 0", False),
        (f"{env.pyvars[-1]} > 1", False),
        ("x.numel() >= 6", False),
        ("x.dtype == torch.float32", False),
        ("torch.is_grad_enabled()", False),
        ("x.is_contiguous()", False),
        ("isinstance(s, float)", False),
    ]
    free = [v for v in env.tensors if not v.lossy and v.dtype != "bool"]
    if free:
        t = draw(st.sampled_from(free))
        conds += [(f"{t.name}.sum() > 0", True), (f"({t.name} > 0.5).any()", True)]
    cond, _ = draw(st.sampled_from(conds))
    kind = draw(st.integers(0, 4))
    extra = draw(st.sampled_from(env.pyvars))
    choices = draw(st.lists(st.integers(0, 9), min_size=len(targets), max_size=len(targets)))
    body = [_update(env, v, c, extra) for v, c in zip(targets, choices, strict=True)]
    other = [_update(env, v, c + 1, extra) for v, c in zip(targets, choices, strict=True)]
    if kind == 0:
        env.lines += [f"if {cond}:", *("    " + b for b in body)]
    elif kind == 1:
        env.lines += [f"if {cond}:", *("    " + b for b in body)]
        env.lines += ["else:", *("    " + b for b in other)]
    elif kind == 2:
        trips = draw(st.sampled_from(["3", "x.shape[0]", "len(y)", "2"]))
        looped = [_update(env, v, c, "i") for v, c in zip(targets, choices, strict=True)]
        env.lines += [f"for i in range({trips}):", *("    " + b for b in looped)]
    elif kind == 3:
        env.lines += ["with torch.no_grad():", *("    " + b for b in body)]
    else:
        env.lines += [
            "j = 0",
            f"while j < 2 and {cond}:",
            *("    " + b for b in body),
            "    j += 1",
        ]
    env.tensors = [
        replace(v, exact=v.exact and v.dtype not in FLOATS) if v in targets else v
        for v in env.tensors
    ]


@st.composite
def no_grad_def(draw: st.DrawFn, env: Env) -> None:
    """A variable defined under a grad-mode context manager (visible after the block)."""
    a = draw(_tensor(env, lambda v: v.dtype in FLOATS))
    ctx = draw(
        st.sampled_from(["torch.no_grad()", "torch.enable_grad()", "torch.inference_mode(False)"])
    )
    out = env.name()
    # Sometimes a graph break inside the block: the mode must hold across it and after it.
    inner = draw(st.sampled_from(["", f"    {out} = {out} + {a.name}.sum().item()"]))
    env.lines += [f"with {ctx}:", f"    {out} = {a.name} * 3 + 1", *([inner] if inner else [])]
    env.tensors.append(_derived(a, out, dtype=_float(a.dtype), exact=False))


@st.composite
def later_closure(draw: st.DrawFn, env: Env) -> None:
    """Define a closure now and call it later, maybe across a graph break, or call an old one."""
    a = draw(_tensor(env, lambda v: v.dtype in FLOATS))
    if env.funcs and draw(st.booleans()):
        g = draw(st.sampled_from(env.funcs))
        out = env.name()
        env.lines.append(f"{out} = {g}({a.name})")
        env.tensors.append(_derived(a, out, exact=False))
        return
    g = env.name("g")
    kind = draw(st.integers(0, 3))
    if kind == 0:
        # The cell is rebound after the definition: the call must see the new value.
        env.lines += [
            f"scale = {draw(st.sampled_from(env.pyvars))}",
            f"def {g}(t):",
            "    return t * scale",
        ]
        env.lines += ["scale = scale + 1"]
    elif kind == 1:
        env.lines += [
            "acc = []",
            f"def {g}(t):",
            "    acc.append(t.sum())",
            "    return t + len(acc)",
        ]
    elif kind == 2:
        env.lines += [f"{g} = functools.partial(torch.clamp, min=-0.5)"]
    else:
        env.lines += [f"def {g}(t, *, k=2):", "    return t ** k if k > 1 else t"]
    env.funcs.append(g)


@st.composite
def graph_break(draw: st.DrawFn, env: Env) -> None:
    """Something Kiln cannot put in a graph, with live containers and closures around it."""
    a = draw(_tensor(env, lambda v: not v.lossy and v.dtype != "bool"))
    kind = draw(st.integers(0, 4))
    k = env.name("k")
    if kind == 0:
        env.lines += [f"{k} = {a.name}.tolist()", f"{k} = len({k}) + 1"]
    elif kind == 1:
        env.lines += [f"{k} = {a.name}.max().item() > 0.25"]
    elif kind == 2:
        env.lines += [f"{k} = [int(v > 0) for v in {a.name}.reshape(-1)[:3]]", f"{k} = sum({k})"]
    elif kind == 3:
        env.lines += [f"{k} = {a.name}.sum()", f"{k} = 2.0 if {k} > 0 else -2.0"]
    else:
        env.lines += [f"{k} = bool(({a.name} != {a.name}).any())", f"{k} = 1 - int({k})"]
    env.pyvars.append(k)


@st.composite
def python_flow(draw: st.DrawFn, env: Env) -> None:
    """Builtins and statements over Python values: zip, sorted, try/except, raise, asserts."""
    a = draw(_tensor(env))
    b = draw(_tensor(env, lambda v: v.shape == a.shape))
    out = env.name()
    kind = draw(st.integers(0, 6))
    keep = replace(a, name=out, input_view=False)
    if kind == 0:
        env.lines += [f"{out} = [t for t, u in zip([{a.name}, {b.name}], [1, 2]) if u > 1][0]"]
        keep = replace(b, name=out, input_view=False)
    elif kind == 1:
        env.lines += [
            "try:",
            f"    {out} = {a.name} + {b.name}.reshape({a.name}.shape[0] + 1)",
            "except RuntimeError:",
            f"    {out} = {a.name}",
        ]
    elif kind == 2:
        env.lines += [
            f"if {a.name}.dim() > 3:",
            f"    raise ValueError('rank ' + str({a.name}.dim()))",
            f"{out} = {a.name}",
        ]
    elif kind == 3:
        env.lines += [
            f"dims = sorted({a.name}.shape, reverse=True)",
            f"{out} = {a.name} if dims[0] >= dims[-1] else {b.name}",
        ]
    elif kind == 4:
        env.lines += [
            f"assert {a.name}.shape == {b.name}.shape, 'shapes'",
            f"{out} = max([{a.name}, {b.name}], key=lambda t: t.dim())",
        ]
    elif kind == 5:
        env.lines += [f"{out} = {a.name}.new_zeros({a.name}.shape) if x.shape[0] > 4 else {a.name}"]
        keep = replace(keep, exact=False)
    else:
        env.lines += [
            "if s > 2.5:",
            "    raise RuntimeError('s too large')",
            f"{out} = {a.name}",
        ]
    env.tensors.append(keep)


@st.composite
def factory(draw: st.DrawFn, env: Env) -> None:
    """New tensors sized from the inputs' metadata."""
    choices = [
        ("torch.ones(x.shape[0]) * s", ("n",), "f32"),
        ("torch.arange(y.shape[1])", ("m",), "i64"),
        ("torch.zeros_like(x, dtype=torch.float64)", ("n", "m"), "f64"),
        ("torch.full((x.size(0), 1), 2.0)", ("n", "1"), "f32"),
        ("x.new_ones(x.shape[1])", ("m",), "f32"),
        ("torch.eye(x.shape[1])", ("m", "m"), "f32"),
        ("torch.linspace(0, 1, y.shape[0])", ("n",), "f32"),
        ("torch.tensor([float(x.shape[0]), s])", ("2",), "f32"),
        ("torch.empty_like(y).fill_(s)", ("n", "m"), "f32"),
    ]
    op, shape, dtype = draw(st.sampled_from(choices))
    out = env.name()
    env.lines.append(f"{out} = {op}")
    env.tensors.append(Var(out, shape, dtype, exact="s" not in op))


STATEMENTS = [
    (unary, 4),
    (binary, 4),
    (scalar_op, 2),
    (compare, 2),
    (reduction, 3),
    (matmul, 2),
    (view_op, 4),
    (masked_select, 1),
    (dtype_change, 2),
    (inplace, 3),
    (python_value, 2),
    (container, 2),
    (closure, 2),
    (global_effect, 1),
    (block, 3),
    (no_grad_def, 1),
    (later_closure, 2),
    (graph_break, 2),
    (python_flow, 2),
    (factory, 1),
]


@st.composite
def statement(draw: st.DrawFn, env: Env) -> None:
    index = draw(st.integers(0, sum(w for _, w in STATEMENTS) - 1))
    for make, weight in STATEMENTS:
        if index < weight:
            draw(make(env))
            return
        index -= weight


@st.composite
def returned(draw: st.DrawFn, env: Env) -> str:
    picks = draw(
        st.lists(st.sampled_from(env.tensors), min_size=1, max_size=3).map(
            lambda vs: [v.name for v in vs]
        )
    )
    last = env.tensors[-1].name
    if last not in picks:
        picks[0] = last
    shape = draw(st.integers(0, 6))
    if shape == 0:
        return picks[0]
    if shape == 1:
        return ", ".join(picks)
    if shape == 2:
        return "[" + ", ".join(picks) + "]"
    if shape == 3:
        return "{" + ", ".join(f"'{p}': {p}" for p in picks) + "}"
    if shape == 4:
        return f"({picks[0]}, ({', '.join([*picks[1:], env.pyvars[-1]])},))"
    if shape == 5:
        return f"{picks[0]}, {picks[0]}.shape[-1] if {picks[0]}.dim() else None"
    return f"{', '.join(picks)}, {env.containers[-1] if env.containers else 'None'}"


PRELUDE = """\
import functools

import torch

G = 1.5
GT = torch.tensor(0.25)
COUNT = 0
LOG = []
CONFIG = {"flag": True}


def helper(t, u):
    return t * G + u
"""


@dataclass(frozen=True)
class Program:
    source: str
    calls: tuple[Call, ...]
    backend: str
    grad: bool

    def describe(self) -> str:
        calls = "\n".join(f"#   {c}" for c in self.calls)
        return f"# backend={self.backend!r} grad={self.grad}\n# calls:\n{calls}\n{self.source}"


@st.composite
def calls(draw: st.DrawFn, grad: bool) -> tuple[Call, ...]:
    count = draw(st.integers(2, 4))
    out = []
    n, m = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    s = draw(st.sampled_from([0.5, -1.0, 2.0]))
    for i in range(count):
        if i and draw(st.booleans()):
            n, m = draw(st.integers(1, 5)), draw(st.integers(1, 5))
            if draw(st.integers(0, 15)) == 0:
                n = 0  # empty inputs: reductions without identity must raise alike
        if i and draw(st.integers(0, 3)) == 0:
            s = draw(st.sampled_from([0.5, -1.0, 2.0, 3.25, 2]))
        layouts = ["contiguous"] * 4 + ["transposed", "sliced"]
        if not grad:
            layouts += ["same", "siblings"]
        out.append(
            Call(
                n=n,
                m=m,
                dtype=draw(st.sampled_from(["f32"] * 5 + ["f64"])),
                layout=draw(st.sampled_from(layouts)),
                s=s,
                seed=draw(st.integers(0, 2**16)),
                set_g=draw(st.sampled_from([None] * 5 + [2.5])) if i else None,
                flip_flag=bool(i) and draw(st.integers(0, 6)) == 0,
                s_by_keyword=draw(st.booleans()),
                under_no_grad=draw(st.integers(0, 7)) == 0,
            )
        )
    return tuple(out)


@st.composite
def programs(
    draw: st.DrawFn, backends: tuple[str, ...] = BACKENDS, grad: bool | None = None
) -> Program:
    """A random program with its calls, its backend and whether inputs require grad."""
    backend = draw(st.sampled_from(backends))
    if grad is None:
        grad = backend != "eager" and draw(st.integers(0, 3)) == 0
    env = Env(grad=grad)
    env.tensors = [Var("x", ("n", "m"), "f32", True), Var("y", ("n", "m"), "f32", True)]
    env.pyvars = ["s"]
    for _ in range(draw(st.integers(1, 7))):
        draw(statement(env))
    ret = draw(returned(env))
    lines = ["global COUNT", *env.lines] if env.counts else env.lines
    body = "\n".join("    " + line for line in lines)
    source = f"{PRELUDE}\n\ndef f(x, y, s):\n{body}\n    return {ret}\n"
    return Program(source=source, calls=draw(calls(grad)), backend=backend, grad=grad)
