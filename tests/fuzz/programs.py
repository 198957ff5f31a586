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

from dataclasses import dataclass

from hypothesis import strategies as st

from .harness import Call
from .python_stmts import (
    block,
    closure,
    container,
    factory,
    global_effect,
    graph_break,
    later_closure,
    no_grad_def,
    python_flow,
    python_value,
)
from .tensor_stmts import (
    binary,
    compare,
    dtype_change,
    inplace,
    masked_select,
    matmul,
    reduction,
    scalar_op,
    unary,
    view_op,
)
from .variables import Env, Var

BACKENDS = ("kiln", "aot_eager", "eager")


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
