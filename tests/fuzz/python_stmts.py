"""Statements over Python: values, containers, closures, globals, blocks, graph breaks."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from .variables import (
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

# ---- Python values, containers, closures, globals -------------------------------------------


@st.composite
def python_value(draw: st.DrawFn, env: Env) -> None:
    a = draw(pick(env))
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
    a = draw(pick(env))
    group = [v for v in env.tensors if v.shape == a.shape and v.dtype == a.dtype]
    members = draw(st.lists(st.sampled_from(group), min_size=1, max_size=3))
    names = ", ".join(v.name for v in members)
    lst, out = env.name("L"), env.name()
    kind = draw(st.integers(0, 7))
    joined = replace(a, input_view=False, exact=a.exact and a.dtype not in FLOATS)
    if kind == 0:
        env.lines += [f"{lst} = [{names}]", f"{out} = torch.stack({lst})"]
        var = replace(joined, name=out, shape=(fresh_dim(env), *a.shape))
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
        var = replace(joined, name=out, shape=(fresh_dim(env),))
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
    a = draw(pick(env, lambda v: v.dtype in FLOATS))
    b = draw(pick(env, lambda v: v.dtype in FLOATS and broadcast(a.shape, v.shape) == a.shape))
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
    a = draw(pick(env))
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
        env.tensors.append(derived(a, out, exact=False))
    else:
        out = env.name()
        env.lines += [f"{out} = {a.name} if CONFIG['flag'] else {a.name} + 1"]
        env.tensors.append(
            derived(a, out, dtype=a.dtype if a.dtype != "bool" else "i64", exact=False)
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
    a = draw(pick(env, lambda v: v.dtype in FLOATS))
    ctx = draw(
        st.sampled_from(["torch.no_grad()", "torch.enable_grad()", "torch.inference_mode(False)"])
    )
    out = env.name()
    # Sometimes a graph break inside the block: the mode must hold across it and after it.
    inner = draw(st.sampled_from(["", f"    {out} = {out} + {a.name}.sum().item()"]))
    env.lines += [f"with {ctx}:", f"    {out} = {a.name} * 3 + 1", *([inner] if inner else [])]
    env.tensors.append(derived(a, out, dtype=as_float(a.dtype), exact=False))


@st.composite
def later_closure(draw: st.DrawFn, env: Env) -> None:
    """Define a closure now and call it later, maybe across a graph break, or call an old one."""
    a = draw(pick(env, lambda v: v.dtype in FLOATS))
    if env.funcs and draw(st.booleans()):
        g = draw(st.sampled_from(env.funcs))
        out = env.name()
        env.lines.append(f"{out} = {g}({a.name})")
        env.tensors.append(derived(a, out, exact=False))
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
    a = draw(pick(env, lambda v: not v.lossy and v.dtype != "bool"))
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
    a = draw(pick(env))
    b = draw(pick(env, lambda v: v.shape == a.shape))
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
