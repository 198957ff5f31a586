"""Statements over tensors: pointwise, reductions, matmuls, views, masks, dtypes, in-place."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from hypothesis import strategies as st

from .variables import (
    DTYPES,
    FLOATS,
    Env,
    Var,
    as_float,
    broadcast,
    derived,
    fresh_dim,
    pick,
    result_dtype,
)

# ---- single statements: each defines a new variable (or mutates one) --------------------------


@st.composite
def unary(draw: st.DrawFn, env: Env) -> None:
    a = draw(pick(env, lambda v: v.dtype != "bool"))
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
        dtype = as_float(a.dtype)
        if "gelu" in op or "silu" in op:
            dtype = a.dtype  # float-only: raises on integers, as eager does
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name)}")
    env.tensors.append(derived(a, name, dtype=dtype, exact=dtype not in FLOATS))


@st.composite
def binary(draw: st.DrawFn, env: Env) -> None:
    a = draw(pick(env, lambda v: v.dtype != "bool"))
    b = draw(pick(env, lambda v: v.dtype != "bool" and broadcast(a.shape, v.shape) is not None))
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
        dtype = as_float(dtype)
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name, b=b.name)}")
    env.tensors.append(Var(name, shape, dtype, lossy=a.lossy or b.lossy, exact=dtype not in FLOATS))


@st.composite
def scalar_op(draw: st.DrawFn, env: Env) -> None:
    a = draw(pick(env, lambda v: v.dtype != "bool"))
    scalar = draw(st.sampled_from([*env.pyvars, "2", "0.5", "-1.5", "G"]))
    if scalar == "G":
        env.uses_globals = True
    op = draw(st.sampled_from(["{a} * {s}", "{a} + {s}", "{s} - {a}", "{a} / ({s} + 3.5)"]))
    pyfloat = scalar not in ("2",) and not scalar.startswith("k")
    dtype = a.dtype if a.dtype in FLOATS else ("f32" if pyfloat or "/" in op else a.dtype)
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name, s=scalar)}")
    env.tensors.append(derived(a, name, dtype=dtype, exact=dtype not in FLOATS))


@st.composite
def compare(draw: st.DrawFn, env: Env) -> None:
    a = draw(pick(env, lambda v: not v.lossy and v.dtype != "bool"))
    b = draw(
        pick(
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
        t = draw(pick(env, lambda v: v.dtype != "bool" and v.shape == c.shape))
        use = draw(
            st.sampled_from(
                [
                    ("torch.where({c}, {t}, torch.zeros_like({t}))", t.dtype, t.shape),
                    ("{t}.masked_fill({c}, -1)", t.dtype, t.shape),
                    ("(~{c}) | ({t} > 1)", "bool", t.shape),
                    ("{c}.sum(-1)" if c.shape else "{c}.long()", "i64", c.shape[:-1]),
                    ("{c}.float() * {t}", as_float(t.dtype), t.shape),
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
    a = draw(pick(env, lambda v: len(v.shape) >= 1))
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
    a = draw(pick(env, lambda v: len(v.shape) == 2 and v.dtype in FLOATS))
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
    a = draw(pick(env))
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
        fresh = fresh_dim(env)
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
            ("{a}[:, 1:]", (p, fresh_dim(env))),
            ("{a}.select(1, 0)", (p,)),
            ("{a}.flatten()", (f"{p}*{q}",)),
            ("{a}.unsqueeze(1).expand(-1, 3, -1)", (p, "3", q)),
            ("{a}.t().contiguous().view({a}.shape[1], -1)", (q, p)),
            ("torch.cat([{a}, {a}.flip(1)], 1)", (p, fresh_dim(env))),
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
    a = draw(pick(env, lambda v: v.dtype != "bool" and not v.lossy and len(v.shape) >= 1))
    if not a.shape or a.dtype == "bool":
        return
    op = draw(
        st.sampled_from(["{a}[{a} > 0]", "{a}[({a} > 0).nonzero()[:, 0]]", "{a}.nonzero()[:, 0]"])
    )
    name = env.name()
    env.lines.append(f"{name} = {op.format(a=a.name)}")
    dtype = "i64" if op.startswith("{a}.nonzero") else a.dtype
    shape: tuple[str, ...] = (fresh_dim(env),)
    if "[:, 0]]" in op:
        shape = (fresh_dim(env), *a.shape[1:])
    env.tensors.append(Var(name, shape, dtype, lossy=a.lossy, exact=a.exact))


@st.composite
def dtype_change(draw: st.DrawFn, env: Env) -> None:
    a = draw(pick(env))
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
    env.tensors.append(derived(a, name, dtype=target, lossy=lossy))


def _inplace_target(env: Env) -> Any:
    """Which variables an in-place op may write: under autograd not a leaf input or its view."""
    return lambda v: not (env.grad and v.input_view)


@st.composite
def inplace(draw: st.DrawFn, env: Env) -> None:
    a = draw(pick(env, _inplace_target(env)))
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
