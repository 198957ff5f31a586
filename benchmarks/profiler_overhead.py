"""Per-call cost of the profiler hooks in generated wrappers, with the profiler off.

Every generated wrapper starts with one check of ``torch.autograd.profiler``'s flag, and runs
a body with ``record_function`` ranges only when a profiler is on. This compiles one small
CPU model twice: as Kiln generates it, and with that check cut from each wrapper's source
(the code before profiler ranges existed), then times a call of each, interleaved, with no
profiler active. The difference is the whole cost of the ranges to unprofiled programs.

Run: ``python benchmarks/profiler_overhead.py`` (with every kiln package importable).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import kiln
from kiln.loopir import pipeline, wrapper

_CHECK = "    if _profiler._is_profiler_enabled:\n        return _profiled(args)\n"


class Small(torch.nn.Module):
    """A few kernels and an extern matmul: launches dominate, so per-kernel cost would show."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x)) * x.sigmoid()
        return self.b(y).softmax(-1) + y.mean(-1, keepdim=True)


@contextlib.contextmanager
def without_profiler_check() -> Iterator[None]:
    """Wrappers loaded inside have the per-call profiler check cut from their source."""
    original = wrapper.load_wrapper

    def stripped(source: str, names: dict[str, Any]) -> wrapper.WrapperCode:
        assert _CHECK in source, "the generated wrapper no longer starts with the check"
        return original(source.replace(_CHECK, ""), names)

    wrapper.load_wrapper = stripped  # type: ignore[assignment]
    pipeline.load_wrapper = stripped  # type: ignore[attr-defined]
    try:
        yield
    finally:
        wrapper.load_wrapper = original  # type: ignore[assignment]
        pipeline.load_wrapper = original  # type: ignore[attr-defined]


def per_call_us(fns: dict[str, Callable[[], Any]], calls: int, repeat: int) -> dict[str, float]:
    """The fastest of ``repeat`` interleaved rounds of the mean time of one call, in µs (the
    fastest: other work on a shared machine only ever adds time)."""
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
    return {name: min(times) for name, times in rounds.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Small().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        instrumented = kiln.compile(model, options={"graph_cache": False})
        instrumented(x)
        with without_profiler_check():
            plain = kiln.compile(Small().eval(), options={"graph_cache": False})
            plain.load_state_dict(model.state_dict())
            plain(x)
        torch.testing.assert_close(instrumented(x), model(x))
        torch.testing.assert_close(plain(x), model(x))
        times = per_call_us(
            {
                "with profiler ranges": lambda: instrumented(x),
                "without": lambda: plain(x),
                "with, again": lambda: instrumented(x),  # the spread between equal programs
            },
            args.calls,
            args.repeat,
        )
    print(f"{'wrapper':<24}{'µs per call':>12}   (profiler off, 1 thread, fastest round)")
    for name, us in times.items():
        print(f"{name:<24}{us:>12.2f}")
    diff = times["with profiler ranges"] - times["without"]
    print(f"{'difference':<24}{diff:>12.2f}")


if __name__ == "__main__":
    main()
