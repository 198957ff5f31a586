"""Fallback ops and vendor kernels per model: what loopir hands to ATen, by name.

``python -m benchmarks.fallbacks [models or suites...] [--mode inference|training|both]``

Each model of the ``cpu`` preset is captured and sent through autograd_aot and loopir's
lowering (the ``kiln`` backend's path up to the IR); the ATen graphs then run eagerly, so
no kernel is generated and a whole suite takes minutes. Per model and mode it prints the
fallback ops (``fallback_ops``: lowerings still missing) and the extern vendor kernels
(``extern_kernels``: GEMMs, convolutions, fused attention, called on purpose), with counts,
and how many graph outputs had to be copied to their traced strides (``output_copies``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import kiln
from benchmarks import models
from kiln import autograd_aot, loopir
from kiln.capture import counters
from kiln.loopir.graph import GraphLowering
from kiln.loopir.pipeline import _default_device

__all__ = ["main", "lower_only"]


def _lower(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    graph = GraphLowering(
        gm, example_inputs, loopir.decompositions(), _default_device(gm, example_inputs)
    )
    graph.run()
    return gm


def lower_only(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """The ``kiln`` backend up to loopir's lowering; the ATen graphs run eagerly."""
    return autograd_aot.aot_compile(
        gm,
        example_inputs,
        fw_compiler=_lower,
        bw_compiler=_lower,
        decompositions=loopir.decompositions(),
    )


def _run(spec: models.ModelSpec, mode: str, device: str) -> dict[str, dict[str, int]]:
    built = spec.build("cpu")
    model = built.model.to(device)
    model.train(mode == "training")
    built.args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in built.args)
    built.kwargs = {
        k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in built.kwargs.items()
    }
    kiln.reset()
    counters.clear()
    compiled = kiln.compile(model, backend=lower_only)
    if mode == "training":
        spec.loss_of(compiled(*built.args, **built.kwargs)).backward()
    else:
        with torch.no_grad():
            compiled(*built.args, **built.kwargs)
    snap = counters.snapshot()
    keys = ("fallback_ops", "extern_kernels", "output_copies", "stats")
    return {k: snap.get(k, {}) for k in keys}


def _short(name: str) -> str:
    return name.removeprefix("aten.").removesuffix(".default")


def _fmt(ops: dict[str, int]) -> str:
    if not ops:
        return "-"
    return ", ".join(f"{_short(k)} x{v}" for k, v in sorted(ops.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "models", nargs="*", help="model or suite names (default: timm huggingface)"
    )
    parser.add_argument("--mode", choices=("inference", "training", "both"), default="both")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (GPU attention kernels)")
    args = parser.parse_args(argv)
    specs = models.select(args.models or ["timm", "huggingface"])
    modes = ("inference", "training") if args.mode == "both" else (args.mode,)
    print("| model | mode | fallback ops | vendor kernels (extern) | output copies |")
    print("|---|---|---|---|---|")
    total = 0
    for spec in specs:
        for mode in modes:
            start = time.perf_counter()
            try:
                found = _run(spec, mode, args.device)
            except Exception as exc:  # report the model, go on
                print(f"| {spec.name} | {mode} | error: {type(exc).__name__}: {exc} | |")
                continue
            total += sum(found["fallback_ops"].values())
            eager = found["stats"].get("eager_fallbacks", 0)
            note = f" (eager fallbacks: {eager})" if eager else ""
            print(
                f"| {spec.name} | {mode} | {_fmt(found['fallback_ops'])}{note} "
                f"| {_fmt(found['extern_kernels'])} | {sum(found['output_copies'].values())} |",
                flush=True,
            )
            print(f"  {spec.name} {mode}: {time.perf_counter() - start:.1f}s", file=sys.stderr)
    print(f"\nfallback ops in total: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
