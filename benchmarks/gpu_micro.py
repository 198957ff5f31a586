"""GPU microbenchmarks, side by side with eager and torch.compile in one run.

- bandwidth: a fused pointwise chain over 2^26 float32 elements and a row softmax over
  32768x4096, as a fraction of the device-to-device copy bandwidth measured in the same run
  (bytes read plus bytes written, CUDA-event medians from ``triton.testing.do_bench``);
- overhead: per-call wall time of a 10-layer Linear+ReLU MLP at batch 8, default mode against
  ``mode="reduce-overhead"`` (CUDA graphs).

Run on the GPU machine: ``python benchmarks/gpu_micro.py`` with every packages/*/src on
PYTHONPATH (``benchmarks/gpu_run.sh micro`` does that).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
from triton.testing import do_bench

import kiln


def pointwise(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 1.5 + 0.25) * x - torch.tanh(x)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def _ms(fn: Callable[[], Any]) -> float:
    return float(do_bench(fn, warmup=50, rep=300, return_mode="median"))


def _per_call_us(fn: Callable[[], Any], calls: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(rounds)[len(rounds) // 2]


def bandwidth() -> list[str]:
    rows = []
    x = torch.randn(2**26, device="cuda")
    out = torch.empty_like(x)
    copy_ms = _ms(lambda: out.copy_(x))
    copy_gbs = 2 * x.numel() * 4 / copy_ms / 1e6
    rows.append(f"| copy 2^26 f32 | {copy_ms:.3f} ms | {copy_gbs:.0f} GB/s | 100% | | |")
    cases = [
        ("pointwise 2^26 f32", pointwise, x, 2 * x.numel() * 4),
        ("softmax 32768x4096 f32", softmax, torch.randn(32768, 4096, device="cuda"), 2 * 2**27 * 4),
    ]
    for name, fn, inp, nbytes in cases:
        compiled = {
            "kiln": kiln.compile(fn),
            "torch.compile": torch.compile(fn),  # the reference Kiln is measured against
        }
        times = {"eager": _ms(lambda fn=fn, inp=inp: fn(inp))}
        for label, cfn in compiled.items():
            torch.testing.assert_close(cfn(inp), fn(inp), atol=1e-5, rtol=1e-5)
            times[label] = _ms(lambda cfn=cfn, inp=inp: cfn(inp))
        gbs = nbytes / times["kiln"] / 1e6
        rows.append(
            f"| {name} | kiln {times['kiln']:.3f} ms | {gbs:.0f} GB/s | "
            f"{100 * gbs / copy_gbs:.0f}% of copy | eager {times['eager']:.3f} ms | "
            f"torch.compile {times['torch.compile']:.3f} ms |"
        )
    return rows


def overhead() -> list[str]:
    layers: list[torch.nn.Module] = []
    for _ in range(10):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda().eval()
    x = torch.randn(8, 64, device="cuda")
    times = {}
    with torch.no_grad():
        times["eager"] = _per_call_us(lambda: model(x))
        for mode in ("default", "reduce-overhead"):
            for name, make in (("kiln", kiln.compile), ("torch.compile", torch.compile)):
                compiled = make(model, mode=mode)
                torch.testing.assert_close(compiled(x), model(x))
                times[f"{name} {mode}"] = _per_call_us(lambda c=compiled: c(x))
                kiln.reset()
                torch._dynamo.reset()
    ratio = times["kiln reduce-overhead"] / times["kiln default"]
    rows = [f"| MLP 10x Linear(64) b8: {k} | {v:.1f} us/call | | | | |" for k, v in times.items()]
    rows.append(f"| kiln reduce-overhead / default | {ratio:.2f} | | | | |")
    return rows


def main() -> None:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, kiln {kiln.__version__}")
    rows = [
        "| case | time | bandwidth | share | eager | torch.compile |",
        "|---|---|---|---|---|---|",
    ]
    rows += bandwidth()
    rows += overhead()
    print("\n".join(rows))


if __name__ == "__main__":
    main()
