"""resnet18 inference over changing image sizes: Kiln's symbolic graph against its static graph
for each size, in one process.

``kiln_dyn`` is ``kiln.compile(model, dynamic=True)`` with symbolic C++ kernels
(``options={"dynamic_kernels": True}``): one compile serves every size. ``kiln_static`` compiles
a graph of its own per size (``dynamic=False``). Reported: the first call of each column at
each size (``kiln_dyn``'s first is its one compile; its later firsts should cost a steady
call), after a warm-up compile at another size so neither column pays the process's one-time
costs, and per size the steady-state time of one call, the two columns timed in turns
(``benchmarks.measure.interleaved_medians``) so load on a shared machine reaches both alike,
with ``dyn/static``, the ratio the symbolic kernels must keep near 1.

``python -m benchmarks.dynamic_cnn`` (``--sizes 56 72 --iters 20 --batch 2``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from benchmarks.measure import interleaved_medians

__all__ = ["main", "run"]


def run(sizes: list[int], batch: int, iters: int) -> str:
    """The table for resnet18 at ``sizes`` (square images of ``batch`` images)."""
    import timm

    import kiln

    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False).eval()
    inputs = {s: torch.randn(batch, 3, s, s) for s in sizes}
    with torch.no_grad():  # one-time costs (imports, compiler probes) before any column
        kiln.compile(model, dynamic=False)(torch.randn(1, 3, 40, 40))
    kiln.reset()
    dyn = kiln.compile(model, dynamic=True, options={"dynamic_kernels": True})
    statics: dict[int, Any] = {}

    def static(x: torch.Tensor) -> Any:
        fn = statics.get(x.shape[-1])
        if fn is None:
            fn = statics[x.shape[-1]] = kiln.compile(model, dynamic=False)
        return fn(x)

    cols = {"kiln_dyn": dyn, "kiln_static": static}
    first: dict[tuple[str, int], float] = {}
    lines = []
    with torch.no_grad():
        for col, fn in cols.items():
            for s in sizes:
                began = time.perf_counter()
                out = fn(inputs[s])
                first[col, s] = time.perf_counter() - began
                torch.testing.assert_close(out, model(inputs[s]), rtol=1e-3, atol=1e-3)
        static_first = statistics.median(first["kiln_static", s] for s in sizes)
        lines.append(
            f"compile (first call): kiln_dyn {first['kiln_dyn', sizes[0]]:.2f} s, kiln_static "
            f"median {static_first:.2f} s per size; kiln_dyn later first calls: "
            + ", ".join(f"{s}: {first['kiln_dyn', s] * 1e3:.0f} ms" for s in sizes[1:])
        )
        lines += ["", "| size | kiln_dyn ms | kiln_static ms | dyn/static |", "|---|---|---|---|"]
        for s in sizes:
            steps = {c: (lambda fn=fn, x=inputs[s]: fn(x)) for c, fn in cols.items()}
            med = interleaved_medians(steps, "cpu", iters, budget_s=10.0)
            ratio = med["kiln_dyn"] / med["kiln_static"]
            lines.append(
                f"| {s} | {med['kiln_dyn'] * 1e3:.2f} | {med['kiln_static'] * 1e3:.2f} "
                f"| {ratio:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dynamic_cnn", description=__doc__)
    p.add_argument("--sizes", nargs="*", type=int, default=[56, 72])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    print(run(args.sizes, args.batch, args.iters))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
