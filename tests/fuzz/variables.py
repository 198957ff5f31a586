"""What the program generator knows of each variable: symbolic shape, dtype, flags.

Shapes are tuples of symbols over the inputs' sizes (``n``, ``m``, literal sizes, fresh ones for
sizes the generator does not follow), so an op is drawn only where it is shape-correct.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from hypothesis import strategies as st

DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "bool": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}
FLOATS = ("f32", "f64", "bf16")


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


def as_float(dtype: str) -> str:
    return dtype if dtype in FLOATS else "f32"


@st.composite
def pick(draw: st.DrawFn, env: Env, pred: Any = None) -> Var:
    pool = [v for v in env.tensors if pred is None or pred(v)]
    if not pool:
        pool = [env.tensors[0]]
    # Recent variables are likelier: programs then read as chains rather than fans.
    index = draw(st.integers(0, len(pool) - 1))
    if draw(st.booleans()):
        index = max(index, len(pool) - 2)
    return pool[index]


def derived(v: Var, name: str, **changes: Any) -> Var:
    return replace(v, name=name, input_view=False, **changes)


def fresh_dim(env: Env) -> str:
    return f"u{next(env.fresh)}"
