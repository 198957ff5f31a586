"""What a failure is, checked the same way in the compiling process and in ``repro.py``.

A :class:`Target` names the stage that failed and how: ``after_capture`` hands the torch-level
graph to the user's backend whole; ``after_aot`` hands the ATen graph to loopir's compile of
one graph. At ``exception`` level the failure is an exception of the recorded type; at
``accuracy`` level it is an output that differs from the graph run eagerly on the same inputs.
The minifier asks :func:`fails` of every candidate graph, and a written script asks it once.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln import autograd_aot, loopir
from kiln.backends import lookup_backend
from kiln.minifier.graphs import clone_inputs

__all__ = ["LEVELS", "STAGES", "Target", "TensorSpec", "fails", "graph_module", "main", "resolve"]

log = logging.getLogger("kiln.frontend.minifier")

STAGES = ("after_capture", "after_aot")
LEVELS = ("accuracy", "exception")
RTOL = ATOL = 1e-3


@dataclasses.dataclass(frozen=True)
class Target:
    """Which stage failed, how, and what to import so the failing code is there again."""

    stage: str
    level: str
    backend: str = "kiln"
    """after_capture: a registered backend's name or ``"module:qualname"``; after_aot:
    ``"reference"`` for loopir's reference backend, else ``"default"``."""
    modules: tuple[str, ...] = ()
    """Imported first: where the user's backend, or a lowering it registers, lives."""
    error: str | None = None
    """The exception's type name, at exception level."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A random tensor of the recorded size, stride, dtype and device."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str

    def make(self) -> torch.Tensor:
        span = 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride, strict=True) if s)
        if self.dtype.is_floating_point or self.dtype.is_complex:
            flat = torch.randn(span, dtype=self.dtype, device=self.device)
        elif self.dtype == torch.bool:
            flat = torch.randint(0, 2, (span,), device=self.device).bool()
        else:
            flat = torch.randint(0, 2, (span,), dtype=self.dtype, device=self.device)
        return flat.as_strided(self.size, self.stride)

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device))


def resolve(module: str, qualname: str) -> Any:
    """The object ``qualname`` names in ``module`` (how a script names a graph's globals)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _backend(ref: str) -> Callable[..., Any]:
    if ":" in ref:
        module, _, qualname = ref.partition(":")
        return resolve(module, qualname)  # type: ignore[no-any-return]
    return lookup_backend(ref)


def _run(target: Target, gm: fx.GraphModule, inputs: Sequence[Any]) -> tuple[Any, Any]:
    """The stage's output on ``inputs`` and the graph's eager output (None unless accuracy)."""
    with torch.no_grad():
        if target.stage == "after_aot":
            aten = autograd_aot.trace_aten(gm, list(inputs), {})
            fakes = [n.meta["val"] for n in aten.graph.nodes if n.op == "placeholder"]
            reference = loopir.ReferenceBackend() if target.backend == "reference" else None
            expected = aten(*clone_inputs(inputs)) if target.level == "accuracy" else None
            compiled = loopir.compile_graph(aten, fakes, backend=reference)
            return compiled(*clone_inputs(inputs)), expected
        expected = copy.deepcopy(gm)(*clone_inputs(inputs)) if target.level == "accuracy" else None
        compiled = _backend(target.backend)(copy.deepcopy(gm), clone_inputs(inputs))
        return compiled(*clone_inputs(inputs)), expected


def mismatch(actual: Any, expected: Any) -> str | None:
    """Where ``actual`` differs from ``expected`` beyond tolerance, or None."""
    got, want = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    if len(got) != len(want):
        return f"{len(got)} outputs, eager gives {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if not isinstance(b, torch.Tensor):
            continue
        if not isinstance(a, torch.Tensor) or a.shape != b.shape:
            return f"output {i}: {_describe(a)}, eager gives {_describe(b)}"
        if not torch.allclose(a.double(), b.double(), rtol=RTOL, atol=ATOL, equal_nan=True):
            worst = (a.double() - b.double()).abs().nan_to_num(0).max().item()
            return f"output {i}: largest difference {worst:.3g} from eager"
    return None


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of size {tuple(value.shape)}"
    return type(value).__name__


def failure(target: Target, gm: fx.GraphModule, inputs: Sequence[Any]) -> str | None:
    """What fails when ``target``'s stage runs ``gm`` on ``inputs`` (None: nothing)."""
    try:
        actual, expected = _run(target, gm, inputs)
    except Exception as e:
        wanted = target.level == "exception" and target.error in (None, type(e).__name__)
        return f"{type(e).__name__}: {e}" if wanted else None
    return mismatch(actual, expected) if target.level == "accuracy" else None


def fails(target: Target, gm: fx.GraphModule, inputs: Sequence[Any]) -> bool:
    """Whether the failure ``target`` describes still occurs on ``gm`` and ``inputs``."""
    return failure(target, gm, inputs) is not None


def graph_module(forward: Callable[..., Any]) -> fx.GraphModule:
    """The graph of a written ``forward(self, ...)``."""
    module = type("Repro", (torch.nn.Module,), {"forward": forward})()
    return fx.symbolic_trace(module)


def main(forward: Callable[..., Any], specs: Sequence[Any], target: Target, data: Path) -> int:
    """``repro.py``'s body: 1 while the failure occurs, 0 once it is gone."""
    for module in target.modules:
        importlib.import_module(module)
    if data.exists():
        inputs = list(torch.load(data, weights_only=True))
    else:
        inputs = [s.make() if isinstance(s, TensorSpec) else s for s in specs]
    found = failure(target, graph_module(forward), inputs)
    # the script's own report, on stdout as a command's answer is
    if found is None:
        sys.stdout.write(f"passes: no {target.level} failure at {target.stage}\n")
        return 0
    sys.stdout.write(f"fails at {target.stage} ({target.level}): {found}\n")
    return 1
