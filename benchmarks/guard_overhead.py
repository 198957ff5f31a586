"""Per-call overhead of Kiln's wrapper and guards against torch.compile's, side by side.

Both compilers use their ``eager`` backend, so the time above plain eager is the cost of the
call path: cache lookup, guard checks, and the compiled frame's glue. Cases: ``x + y`` on
8-element tensors, and 10- and 100-layer ``nn.Sequential`` stacks of small Linear layers (Kiln's
target: the 100-layer overhead within 1.5x of the 10-layer one).

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


def per_call_us(fn: Callable[[], Any], calls: int, repeat: int) -> float:
    """Median over ``repeat`` rounds of the mean time of one call, in microseconds."""
    for _ in range(calls // 10 + 1):
        fn()
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, kiln {kiln.__version__}; microseconds per call")
    print(f"{'case':32} {'eager':>9} {'kiln +':>9} {'torch.compile +':>16}")
    with torch.no_grad():
        for name, (fn, inputs) in cases().items():
            kiln_fn = kiln.compile(fn, backend="eager")
            torch_fn = torch.compile(fn, backend="eager")
            kiln_fn(*inputs)
            torch_fn(*inputs)
            eager = per_call_us(lambda f=fn, i=inputs: f(*i), args.calls, args.repeat)
            k = per_call_us(lambda f=kiln_fn, i=inputs: f(*i), args.calls, args.repeat)
            t = per_call_us(lambda f=torch_fn, i=inputs: f(*i), args.calls, args.repeat)
            print(f"{name:32} {eager:9.2f} {k - eager:9.2f} {t - eager:16.2f}")


if __name__ == "__main__":
    main()
