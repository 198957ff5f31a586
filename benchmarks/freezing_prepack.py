"""Frozen CPU inference with and without oneDNN weight prepacking, beside eager.

Per model and batch, three columns timed interleaved in one process (each round calls every
column once, starting at another column each round; medians over the rounds): ``eager`` (the
timm model under ``no_grad``), ``frozen`` (``kiln.compile`` with ``KILN_FREEZING_PREPACK=0``:
batch norm folded, ATen's convolutions) and ``prepack`` (the default: convolutions on weights
reordered once for oneDNN, with the op after them fused). Both wall time and the process's
CPU time are reported: on a shared machine other processes' load moves wall time far more.
``--no-eager`` leaves eager out of the rounds (its threads then never run between the two
compiled columns). The graph cache is off, so each column compiles its own program.

Run: ``python -m benchmarks.freezing_prepack --models resnet18 convnext_tiny --batches 1 8``
from the repository root (every kiln package importable, timm installed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln


def _compiled(model: torch.nn.Module, x: torch.Tensor, prepack: bool) -> Callable[[], Any]:
    os.environ["KILN_FREEZING_PREPACK"] = "1" if prepack else "0"  # read when compiling
    kiln.reset()
    compiled = kiln.compile(model)
    compiled(x)
    return lambda: compiled(x)


def run(name: str, batch: int, rounds: int, eager: bool) -> str:
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval().requires_grad_(False)
    x = torch.randn(batch, 3, 224, 224)
    with torch.no_grad():
        ref = model(x)
        steps = {"frozen": _compiled(model, x, False), "prepack": _compiled(model, x, True)}
        if eager:
            steps["eager"] = lambda: model(x)
        errors = {k: float((steps[k]() - ref).norm() / ref.norm()) for k in ("frozen", "prepack")}
        wall: dict[str, list[float]] = {k: [] for k in steps}
        cpu: dict[str, list[float]] = {k: [] for k in steps}
        names = list(steps)
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                t, c = time.perf_counter(), time.process_time()
                steps[k]()
                wall[k].append(time.perf_counter() - t)
                cpu[k].append(time.process_time() - c)
    parts = [f"{name} b{batch}"]
    for label, times in (("wall", wall), ("cpu", cpu)):
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        cols = " ".join(f"{k} {v:.1f}" for k, v in med.items())
        ratio = f"prepack {med['frozen'] / med['prepack']:.2f}x frozen"
        if eager:
            ratio += f", {med['eager'] / med['prepack']:.2f}x eager"
        parts.append(f"{label} ms: {cols} ({ratio})")
    parts.append(f"rel. error frozen {errors['frozen']:.1e} prepack {errors['prepack']:.1e}")
    return " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--no-eager", action="store_true")
    args = parser.parse_args()
    os.environ["KILN_GRAPH_CACHE"] = "0"
    if args.threads:
        torch.set_num_threads(args.threads)
    for batch in args.batches:
        for name in args.models:
            print(run(name, batch, args.rounds, not args.no_eager), flush=True)


if __name__ == "__main__":
    main()
