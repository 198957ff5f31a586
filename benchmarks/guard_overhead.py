"""Per-call overhead of Kiln's wrapper and guards against torch.compile's, side by side.

Both compilers use their ``eager`` backend, so the time above plain eager is the cost of the
call path: cache lookup, guard checks, and the compiled frame's glue. Cases: ``x + y`` on
8-element tensors, and 10- and 100-layer ``nn.Sequential`` stacks of small Linear layers (Kiln's
target: the 100-layer overhead within 1.5x of the 10-layer one).

The last column, ``kiln glue``, is Kiln's call minus its captured graph called directly on the
same inputs: the wrapper, the cache lookup and guard check, and the output code loading the
graph's inputs (parameters included). It is what grows with depth if anything does.

Run: ``python benchmarks/guard_overhead.py`` (with every kiln package importable).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
