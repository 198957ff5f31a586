"""One zoo model under one compiler and mode: capture counts, break sites and eager parity.

Each compiler wraps its own deep copy of the model; an eager copy is the reference. Every call
draws fresh inputs of the same shapes and resets the RNG before the eager and the compiled step
(dropout is off in the zoo's configs, so this only guards stochastic layers the builders miss).
Eval mode runs under ``no_grad``; train mode also backpropagates a scalar loss (the mean of
every floating-point output, summed) and compares every parameter's gradient.

Counts are read after the first call, before anything could recompile: graphs compiled, graph
breaks inside frames (kind, explanation, the user's ``file:line`` and source text, from Kiln's
graph-break log), and frames capture gave up on whole (Kiln's frontend log line for a frame it
runs eagerly, and the warning of a frame whose compile failed inside Kiln). torch.compile's
counts come from Dynamo's own counters, read the same way.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from benchmarks.measure import TOLERANCES, flat_tensors, relative_error
from benchmarks.zoo.spec import Built, make_inputs

__all__ = ["CALLS", "Outcome", "check"]

CALLS = 3
_TOLERANCE = TOLERANCES["float32"]


@dataclasses.dataclass
class Outcome:
    """What one compiler did to one model in one mode (JSON-ready through ``asdict``)."""

    compiler: str
    mode: str
    graphs: int = 0
    breaks: int = 0
    break_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    sites: list[dict[str, str]] = dataclasses.field(default_factory=list)
    gave_up: list[dict[str, str]] = dataclasses.field(default_factory=list)
    recompiles: int = 0
    max_error: float = 0.0
    matches: bool = False
    # differs from eager but matches eager run with ``torch.compiler.is_compiling()`` True:
    # the library computes otherwise when it believes it is compiled (both compilers do so)
    compiled_path: bool = False
    error: str = ""
    seconds: float = 0.0

    @property
    def one_graph(self) -> bool:
        """One graph, no break, no frame given up, and eager's answer (or the answer of the
        library's own compiled path)."""
        right = self.matches or self.compiled_path
        return right and self.graphs == 1 and self.breaks == 0 and not self.gave_up


def _loss(out: Any) -> torch.Tensor:
    parts = [
        t.float().mean() for t in flat_tensors(out) if t.is_floating_point() and t.requires_grad
    ]
    return torch.stack(parts).sum() if parts else torch.zeros(())


def _step(model: torch.nn.Module, inputs: dict[str, Any], train: bool, seed: int) -> list[Any]:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    if not train:
        with torch.no_grad():
            return flat_tensors(model(**inputs))
    out = model(**inputs)
    loss = _loss(out)
    if loss.requires_grad:
        loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return [t.detach() for t in flat_tensors(out)] + grads


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _listen(names: list[str]) -> Iterator[_Records]:
    handler = _Records()
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)


def _where(frame: Any) -> dict[str, str]:
    if frame is None:
        return {"where": "", "source": ""}
    return {
        "where": f"{frame.filename}:{frame.lineno} in {frame.name}",
        "source": (frame.source or "").strip(),
    }


class _Kiln:
    name = "kiln"

    def __init__(self) -> None:
        import kiln

        self.kiln = kiln
        kiln.reset()
        self._logs = _listen(["kiln.capture.graph_breaks", "kiln.frontend.graph_breaks"])
        self.records = self._logs.__enter__()
        self._warnings = warnings.catch_warnings(record=True)
        self.warned = self._warnings.__enter__()
        warnings.simplefilter("always")

    def compile(self, model: torch.nn.Module) -> Callable[..., Any]:
        return self.kiln.compile(model, backend="eager")  # type: ignore[no-any-return]

    def count(self, o: Outcome) -> None:
        s = self.kiln.stats()
        o.graphs = s.graphs_compiled
        for r in self.records.records:
            if str(r.msg).startswith("graph break in"):
                _qualname, kind, explanation, frame = r.args  # type: ignore[misc]
                o.sites.append(
                    {"kind": str(kind), "explanation": str(explanation), **_where(frame)}
                )
            elif str(r.msg).startswith("running"):
                name, e = r.args  # type: ignore[misc]
                o.gave_up.append(
                    {
                        "frame": str(name),
                        "kind": getattr(e, "kind", type(e).__name__),
                        "explanation": str(getattr(e, "explanation", e)),
                        **_where(getattr(e, "frame", None)),
                    }
                )
        for w in self.warned:
            text = str(w.message)
            if text.startswith("kiln: compiling"):
                frame = text.split(" failed", 1)[0].removeprefix("kiln: compiling ")
                why = text.split("failed (", 1)[-1].rsplit("); it runs eagerly", 1)[0]
                o.gave_up.append(
                    {"frame": frame, "kind": "compile_failed", "explanation": why, "where": ""}
                )
            elif text.startswith("kiln: the backend failed"):
                o.gave_up.append(
                    {"frame": "", "kind": "backend_failed", "explanation": text, "where": ""}
                )
        o.breaks = len(o.sites)
        for site in o.sites:
            o.break_kinds[site["kind"]] = o.break_kinds.get(site["kind"], 0) + 1

    def finish(self, o: Outcome) -> None:
        o.recompiles = self.kiln.stats().recompiles
        self._warnings.__exit__(None, None, None)
        self._logs.__exit__(None, None, None)


class _Dynamo:
    """torch.compile as it behaves in a fresh process, its own frames run eagerly counted.

    Its first compile in a process turns off argument checks in ``torch.distributions`` for
    the whole process; here they are off for its own runs only, so the Kiln runs after it in
    the same process check arguments as a user's program does. A frame it skips (a graph
    break in a loop runs the whole frame eagerly) counts as given up on, as Kiln's do: graph
    and break counters alone miss it.
    """

    name = "torch.compile"

    def __init__(self) -> None:
        import torch._dynamo
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        self.counters = counters
        distribution = torch.distributions.Distribution
        self._validate_args = distribution._validate_args
        distribution.set_default_validate_args(False)

    def compile(self, model: torch.nn.Module) -> Callable[..., Any]:
        return torch.compile(model, backend="eager")

    def count(self, o: Outcome) -> None:
        c = self.counters
        o.graphs = int(c["stats"]["unique_graphs"])
        for reason, n in c["graph_break"].items():
            kind = reason.split("\n", 1)[0].strip()
            detail = reason.split("Explanation:", 1)[-1].split("\n", 1)[0].strip()
            for _ in range(n):
                o.sites.append({"kind": kind, "explanation": detail, "where": "", "source": ""})
        o.breaks = len(o.sites)
        for site in o.sites:
            o.break_kinds[site["kind"]] = o.break_kinds.get(site["kind"], 0) + 1
        frames = c["frames"]
        for _ in range(int(frames.get("total", 0)) - int(frames.get("ok", 0))):
            o.gave_up.append(
                {
                    "frame": "",
                    "kind": "frame_skipped",
                    "explanation": "torch.compile ran a frame eagerly",
                    "where": "",
                }
            )

    def finish(self, o: Outcome) -> None:
        o.recompiles = int(self.counters["stats"].get("unique_graphs", 0)) - o.graphs
        torch.distributions.Distribution.set_default_validate_args(self._validate_args)


@contextmanager
def _as_if_compiling() -> Iterator[None]:
    """Eager code that sees ``torch.compiler.is_compiling()`` True, as compiled code does."""
    real = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        yield
    finally:
        torch.compiler.is_compiling = real


def _matches_compiled_path(built: Built, compiled: Callable[..., Any], train: bool) -> bool:
    """Whether the compiled model agrees with eager once eager takes the library's compiled
    path: transformers, for one, builds masks otherwise when it believes it is compiled."""
    eager = copy.deepcopy(built.model).train(train)
    worst = 0.0
    for call in range(CALLS):
        inputs = make_inputs(built.inputs_for(train), 1 + call)
        with _as_if_compiling():
            expected = _step(eager, inputs, train, call)
        actual = _step(compiled, inputs, train, call)  # type: ignore[arg-type]
        worst = max(worst, relative_error(actual, expected))
    return worst <= _TOLERANCE


def check(built: Built, compiler: str, mode: str) -> Outcome:
    """Run ``built`` compiled by ``compiler`` (kiln or torch.compile) in ``mode`` against eager."""
    o = Outcome(compiler, mode)
    train = mode == "train"
    started = time.perf_counter()
    eager = copy.deepcopy(built.model).train(train)
    mine = copy.deepcopy(built.model).train(train)
    runner = _Kiln() if compiler == "kiln" else _Dynamo()
    try:
        compiled = runner.compile(mine)
        worst = 0.0
        for call in range(CALLS):
            inputs = make_inputs(built.inputs_for(train), 1 + call)
            expected = _step(eager, inputs, train, call)
            actual = _step(compiled, inputs, train, call)  # type: ignore[arg-type]
            if call == 0:
                runner.count(o)
            worst = max(worst, relative_error(actual, expected))
        o.max_error = worst
        o.matches = worst <= _TOLERANCE
        if not o.matches:
            o.compiled_path = _matches_compiled_path(built, compiled, train)
    except Exception as e:
        o.error = f"{type(e).__name__}: {e}"[:500]
        o.error += "\n" + "".join(traceback.format_exc().splitlines(keepends=True)[-6:])
    finally:
        runner.finish(o)
    o.seconds = time.perf_counter() - started
    return o
