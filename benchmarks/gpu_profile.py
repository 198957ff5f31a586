"""Where a model's GPU time goes: the top CUDA kernels of Kiln and torch.compile, side by side.

``python benchmarks/gpu_profile.py resnet50 vit_base_patch16_224 [--dtype bfloat16]
[--mode training] [--top 12] [--host 30]`` builds each model at the ``gpu`` preset, compiles it with both,
and prints per compiler the wall time of a step, its host time, its time run back to back, the
device time of its kernels and how many it launches (a wall time well above the device time
means the GPU waits on the host), then the kernels that take the most time, and with
``--host`` the ATen ops and Python functions a step spends its host time in. Used to decide what to optimise; numbers for reports come
from ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
from torch.profiler import ProfilerActivity, profile

import kiln
from benchmarks import models
from benchmarks.worker import Job, _prepare, _step, strict_float32

STEPS = 5


def _wall_ms(step: Callable[[], Any]) -> float:
    times = []
    for _ in range(20):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _host_ms(step: Callable[[], Any]) -> tuple[float, float]:
    """(host time of a step, time per step run back to back): the first is what the Python
    side costs (measured without waiting for the GPU, whose queue stays short here); the
    second what the benchmark times for short steps. Equal: the step is host-bound."""
    torch.cuda.synchronize()
    host = []
    for _ in range(30):
        start = time.perf_counter()
        step()
        host.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    return statistics.median(host) * 1e3, (time.perf_counter() - start) / 50 * 1e3


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


def _host(step: Callable[[], Any], top: int) -> str:
    """Where a step's host time goes: the ``top`` ATen ops by host time (which library calls
    launch what), then the ``top`` Python functions by own time, over 20 steps."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    ops = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return f"{ops}\n{out.getvalue()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--mode", default="inference", choices=["inference", "training"])
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--host", type=int, default=0, help="print this many host functions")
    parser.add_argument("--debug-dir", help="Kiln writes each graph's generated code here")
    args = parser.parse_args()
    # the harness's precision setting (worker.run_job)
    torch.backends.cudnn.allow_tf32 = not strict_float32("cuda", args.dtype, args.mode)
    for name in args.models:
        spec = models.get(name)
        job = Job(name, [], device="cuda", dtype=args.dtype, mode=args.mode, preset="gpu")
        built = _prepare(spec, job)
        want = models.first_tensor(_step(spec, built, built.model, job)()).float()
        eager_ms = _wall_ms(_step(spec, built, built.model, job))
        print(f"\n# {name} {args.dtype} {args.mode}: eager {eager_ms:.2f} ms wall")
        options = {"debug_dir": f"{args.debug_dir}/{name}"} if args.debug_dir else {}
        compilers: list[tuple[str, Callable[[Any], Any]]] = [
            ("kiln", lambda m, o=options: kiln.compile(m, options=o)),
            ("torch.compile", torch.compile),
        ]
        for label, make in compilers:
            step = _step(spec, built, make(built.model), job)
            got = models.first_tensor(step()).float()
            wall = _wall_ms(step)
            host, back_to_back = _host_ms(step)
            total, launches, top = _profile(step)
            err = ((got - want).norm() / want.norm()).item()
            print(
                f"\n## {name} {label}: {wall:.2f} ms wall, {host:.2f} ms host, "
                f"{back_to_back:.2f} ms back to back, {total / 1e3:.2f} ms device, "
                f"{launches} launches, relative error {err:.2e}"
            )
            for kernel, us, count in top[: args.top]:
                print(f"{us / 1e3:8.3f} ms  x{count:<4d} {kernel[:110]}")
            if args.host:
                print(_host(step, args.host))
            kiln.reset()
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
