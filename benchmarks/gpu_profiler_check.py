"""What ``torch.profiler`` shows of a compiled CUDA model: Kiln's ranges and Triton's kernels.

Prints the region ranges (``kiln: <function> graph <n>``), the range around each Triton
launch (``kiln_triton_<ops>_<n>``) and the CUDA kernels the trace holds (``kiln_<kind>_...``),
and exits 1 when a generated kernel has no range or no CUDA kernel of its name.

Run on a GPU machine: ``python benchmarks/gpu_profiler_check.py``.
"""

from __future__ import annotations

import sys

import torch

import kiln


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)).softmax(-1) * 2 + x.sin()


def main() -> int:
    model = Small().cuda()
    compiled = kiln.compile(model)
    x = torch.randn(32, 64, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            out = compiled(x)
            torch.cuda.synchronize()
        torch.testing.assert_close(out, model(x))
    names = sorted({e.key for e in prof.key_averages()})
    regions = [n for n in names if n.startswith("kiln: ")]
    ranges = [n for n in names if n.startswith("kiln_triton_")]
    kernels = [n for n in names if n.startswith("kiln_") and not n.startswith("kiln_triton_")]
    print("regions:", regions)
    print("launch ranges:", ranges)
    print("CUDA kernels:", kernels)
    ok = bool(regions) and bool(ranges) and len(kernels) >= len(ranges)
    print("OK" if ok else "MISSING")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
