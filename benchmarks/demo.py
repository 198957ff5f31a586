"""The demo: compile a real model on CPU with Kiln, check it against eager, and report.

Run with ``nox -s demo`` (or ``python benchmarks/demo.py --backend eager``). It prints the
speedup over eager, compile time, graphs, kernels and where the generated code was written.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln


def mlp_block() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A transformer-style MLP block with LayerNorm and GELU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.LayerNorm(256),
        torch.nn.Linear(256, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 256),
        torch.nn.LayerNorm(256),
    ).eval()
    return model, (torch.randn(64, 256),)


def resnet18() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """timm's resnet18 with random weights (nothing is downloaded)."""
    import timm

    torch.manual_seed(0)
    return timm.create_model("resnet18", pretrained=False).eval(), (torch.randn(2, 3, 224, 224),)


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]] = {
    "mlp_block": mlp_block,
    "resnet18": resnet18,
}


def median_time(fn: Callable[[], Any], repeat: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--backend", default="kiln", choices=kiln.list_backends())
    args = parser.parse_args()

    model, inputs = MODELS[args.model]()
    debug_dir = tempfile.mkdtemp(prefix="kiln-demo-")
    compiled = kiln.compile(model, backend=args.backend, options={"debug_dir": debug_dir})
    kiln.reset()
    with torch.no_grad():
        start = time.perf_counter()
        out = compiled(*inputs)
        compile_s = time.perf_counter() - start
        expected = model(*inputs)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        eager_s = median_time(lambda: model(*inputs))
        kiln_s = median_time(lambda: compiled(*inputs))
    s = kiln.stats()
    print(f"model            {args.model} (backend {args.backend!r}, CPU, float32)")
    print("correct          yes (matches eager within 1e-4)")
    print(f"eager            {eager_s * 1e3:.2f} ms")
    print(f"kiln             {kiln_s * 1e3:.2f} ms   speedup {eager_s / kiln_s:.2f}x")
    print(f"first call       {compile_s:.2f} s (capture + compile + run)")
    print(f"graphs           {s.graphs_compiled}, graph breaks {s.graph_breaks}")
    print(
        f"kernels          {dict(s.kernels) or 'none'}; fallback ops {dict(s.fallback_ops) or 'none'}"
    )
    print(f"eager fallbacks  {s.eager_fallbacks}")
    print(f"generated code   {debug_dir}")


if __name__ == "__main__":
    main()
