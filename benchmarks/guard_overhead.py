"""Per-call overhead of Kiln's wrapper and guards against torch.compile's, side by side.

Both compilers use their ``eager`` backend, so the time above plain eager is the cost of the
call path: cache lookup, guard checks, and the compiled frame's glue. Cases: ``x + y`` on
8-element tensors, and 10- and 100-layer ``nn.Sequential`` stacks of small Linear layers (Kiln's
target: the 100-layer overhead within 1.5x of the 10-layer one).

The last column, ``kiln glue``, is Kiln's call minus its captured graph called directly on the
same inputs: the wrapper, the cache lookup and guard check, and the output code loading the
graph's inputs (parameters included). It is what grows with depth if anything does.

A second table times the generated guard check alone (``GuardCheck.fn``, built from guard
records as capture writes them) for one frame guarded on static sizes and on symbolic ones
(``TENSOR_MATCH`` with None sizes and a dense order, plus the ``SHAPE`` relations of a
``ShapeEnv``), with their ratio.

Run: ``python benchmarks/guard_overhead.py`` (with every kiln package importable).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln
from kiln import guards
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.shapes import ShapeEnv, symbolic_meta
from kiln.capture.source import LocalSource


def per_call_us(fns: dict[str, Callable[[], Any]], calls: int, repeat: int) -> dict[str, float]:
    """Median over ``repeat`` rounds of the mean time of one call, in microseconds, per callable.

    The callables take turns within each round, so load from other work on the machine
    shifts all of them alike instead of whichever happened to run during it.
    """
    for fn in fns.values():
        for _ in range(calls // 10 + 1):
            fn()
    rounds: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            rounds[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(times) for name, times in rounds.items()}


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def stack(depth: int) -> torch.nn.Module:
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(depth)]).eval()


def cases() -> dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return {
        "x + y (8 elements)": (add, (torch.randn(8), torch.randn(8))),
        "Sequential x10 Linear(4,4)": (stack(10), (torch.randn(2, 4),)),
        "Sequential x100 Linear(4,4)": (stack(100), (torch.randn(2, 4),)),
    }


def recording_eager(graphs: list[Callable[[], Any]]) -> Callable[..., Any]:
    """Kiln's ``eager`` backend that also keeps each graph's call on its example inputs."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(lambda f=gm.forward, i=tuple(example_inputs): f(*i))
        return gm.forward

    return backend


def static_specs(inputs: dict[str, torch.Tensor]) -> list[GuardSpec]:
    state = GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current())
    tensors = [
        GuardSpec(LocalSource(n), GuardKind.TENSOR_MATCH, TensorMeta.of(t))
        for n, t in inputs.items()
    ]
    return [state, *tensors]


def dynamic_specs(
    inputs: dict[str, torch.Tensor], decide: Callable[[dict[str, torch.Tensor]], None]
) -> list[GuardSpec]:
    """The frame's guards with every size symbolic (duck-sized, ranges guarded) and the
    relations ``decide`` adds, as capture records them for a dense input."""
    env = ShapeEnv()
    metas = {n: symbolic_meta(t, LocalSource(n), env) for n, t in inputs.items()}
    decide(metas)
    specs = [GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current())]
    for n, t in inputs.items():
        sizes = tuple(s if isinstance(s, int) else None for s in metas[n].shape)
        order = tuple(sorted(range(t.dim()), key=functools.partial(_stride_key, t)))
        meta = TensorMeta(
            type(t), t.dtype, t.device, t.requires_grad, sizes, (None,) * t.dim(), dense_order=order
        )
        specs.append(GuardSpec(LocalSource(n), GuardKind.TENSOR_MATCH, meta))
    return [*specs, GuardSpec(None, GuardKind.SHAPE, env)]


def _stride_key(t: torch.Tensor, d: int) -> tuple[int, int]:
    return t.stride(d), t.size(d)


def _no_decisions(m: dict[str, torch.Tensor]) -> None:
    pass


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


def _attention_decisions(m: dict[str, torch.Tensor]) -> None:
    x, w = m["x"], m["w"]
    bool(x.size(2) == w.size(0))  # the matmul's inner sizes
    bool(x.size(1) % 4 == 0)  # a view into 4 heads
    bool(x.size(0) * x.size(1) > 16)


def guard_cost_cases() -> dict[str, tuple[Callable[..., Any], dict[str, torch.Tensor], Any]]:
    return {
        "x + y (8 elements)": (add, {"x": torch.randn(8), "y": torch.randn(8)}, _no_decisions),
        "x (2, 8, 16) @ w (16, 16)": (
            matmul,
            {"x": torch.randn(2, 8, 16), "w": torch.randn(16, 16)},
            _attention_decisions,
        ),
    }


def guard_cost(calls: int, repeat: int) -> None:
    """Per-call cost of the generated check alone: static sizes against symbolic ones."""
    print(f"\n{'guard check alone':32} {'static':>9} {'dynamic':>9} {'ratio':>7}")
    for name, (fn, inputs, decide) in guard_cost_cases().items():
        static = guards.build_check(static_specs(inputs), fn)
        dynamic = guards.build_check(dynamic_specs(inputs, decide), fn)
        args = tuple(inputs.values())
        assert static(*args) and dynamic(*args), dynamic.source
        times = per_call_us(
            {
                "static": functools.partial(static.fn, *args),
                "dynamic": functools.partial(dynamic.fn, *args),
            },
            calls * 10,
            repeat,
        )
        st, dy = times["static"], times["dynamic"]
        print(f"{name:32} {st:9.3f} {dy:9.3f} {dy / st:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--guards-only", action="store_true", help="only the static/dynamic guard check table"
    )
    args = parser.parse_args()
    if args.guards_only:
        guard_cost(args.calls, args.repeat)
        return
    print(f"torch {torch.__version__}, kiln {kiln.__version__}; microseconds per call")
    print(f"{'case':32} {'eager':>9} {'kiln +':>9} {'torch.compile +':>16} {'kiln glue':>12}")
    with torch.no_grad():
        for name, (fn, inputs) in cases().items():
            graphs: list[Callable[[], Any]] = []
            kiln_fn = kiln.compile(fn, backend=recording_eager(graphs))
            torch_fn = torch.compile(fn, backend="eager")
            kiln_fn(*inputs)
            torch_fn(*inputs)
            (graph,) = graphs
            times = per_call_us(
                {
                    "eager": lambda f=fn, i=inputs: f(*i),
                    "kiln": lambda f=kiln_fn, i=inputs: f(*i),
                    "torch": lambda f=torch_fn, i=inputs: f(*i),
                    "graph": graph,
                },
                args.calls,
                args.repeat,
            )
            eager, k, t, g = times["eager"], times["kiln"], times["torch"], times["graph"]
            print(f"{name:32} {eager:9.2f} {k - eager:9.2f} {t - eager:16.2f} {k - g:12.2f}")
    guard_cost(args.calls, args.repeat)


if __name__ == "__main__":
    main()
