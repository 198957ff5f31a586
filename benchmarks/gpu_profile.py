"""Where a model's GPU time goes: the top CUDA kernels of Kiln and torch.compile, side by side.

``python benchmarks/gpu_profile.py resnet50 vit_base_patch16_224 [--dtype bfloat16] [--top 12]``
builds each model at the ``gpu`` preset (inference), compiles it with both, profiles a few
steps with ``torch.profiler`` and prints, per compiler, device time per step, kernels per step
and the kernels that take the most time. Used to decide what to optimise; numbers for reports
come from ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import collections
import re
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
from torch.profiler import ProfilerActivity, profile

import kiln
from benchmarks import models

STEPS = 5


def _profile(step: Callable[[], Any]) -> tuple[float, int, list[tuple[str, float, int]]]:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = collections.defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            # generated kernels end in a serial number: group them by what they fuse
            per_kernel[re.sub(r"_\d+$", "", event.name)].append(event.device_time)
    total_us = sum(sum(v) for v in per_kernel.values()) / STEPS
    launches = sum(len(v) for v in per_kernel.values()) // STEPS
    top = sorted(
        ((name, sum(v) / STEPS, len(v) // STEPS) for name, v in per_kernel.items()),
        key=lambda item: -item[1],
    )
    return total_us, launches, top


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    for name in args.models:
        built = models.get(name).build("gpu")
        model = built.model.to("cuda", dtype).eval()

        def move(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                x = x.to("cuda")
                return x.to(dtype) if x.is_floating_point() else x
            return x

        inputs = [move(a) for a in built.args]
        kwargs = {k: move(v) for k, v in built.kwargs.items()}
        with torch.no_grad():
            want = models.first_tensor(model(*inputs, **kwargs)).float()
        for label, make in (("kiln", kiln.compile), ("torch.compile", torch.compile)):
            compiled = make(model)
            with torch.no_grad():
                got = models.first_tensor(compiled(*inputs, **kwargs)).float()
                total, launches, top = _profile(lambda c=compiled, a=inputs, k=kwargs: c(*a, **k))
            err = ((got - want).norm() / want.norm()).item()
            print(
                f"\n## {name} {args.dtype} {label}: {total / 1e3:.2f} ms device, "
                f"{launches} launches, relative error {err:.2e}"
            )
            for kernel, us, count in top[: args.top]:
                print(f"{us / 1e3:8.3f} ms  x{count:<4d} {kernel[:110]}")
            kiln.reset()
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
