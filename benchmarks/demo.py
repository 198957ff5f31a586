"""The demo: compile a real model from the suite on CPU with Kiln, check it against eager, report.

Run with ``nox -s demo`` (or ``python benchmarks/demo.py --model resnet18 --backend kiln``). It
prints the speedup over eager, compile time, graphs, kernels, what fell back to eager and where
the generated code was written. While parts of Kiln still fall back to eager PyTorch the demo
keeps working and says what fell back; it exits non-zero only if the output is wrong or Kiln
raised.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# Run as a script: import the benchmarks package from the repository root, not this folder.
ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

import torch  # noqa: E402

import kiln  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks.measure import (  # noqa: E402
    TOLERANCES,
    flat_tensors,
    interleaved_medians,
    relative_error,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    names = sorted(s.name for s in models.select(None))
    parser.add_argument("--model", choices=names, default="resnet18")
    parser.add_argument("--backend", default="kiln", choices=kiln.list_backends())
    parser.add_argument(
        "--debug-dir", help="where Kiln writes generated code (default: a temp dir)"
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    spec = models.get(args.model)
    built = spec.build("cpu")
    model = built.model.eval()

    def run(fn: object) -> list[torch.Tensor]:
        with torch.no_grad():
            return flat_tensors(fn(*built.args, **built.kwargs))  # type: ignore[operator]

    debug_dir = args.debug_dir or tempfile.mkdtemp(prefix="kiln-demo-")
    expected = run(model)
    kiln.reset()
    compiled = kiln.compile(model, backend=args.backend, options={"debug_dir": debug_dir})
    start = time.perf_counter()
    try:
        out = run(compiled)
    except Exception as e:
        print(f"kiln raised on the first call: {type(e).__name__}: {e}")
        return 1
    first_call_s = time.perf_counter() - start
    err = relative_error(out, expected)
    # Interleaved rounds, so a busy machine slows both alike; the best of three.
    steps = {"eager": lambda: run(model), "kiln": lambda: run(compiled)}
    for _ in range(2):
        for step in steps.values():
            step()
    eager_s = kiln_s = float("inf")
    for _ in range(3):
        medians = interleaved_medians(steps, "cpu", 10, 2.0)
        eager_s, kiln_s = min(eager_s, medians["eager"]), min(kiln_s, medians["kiln"])
    s = kiln.stats()
    files = [p for p in Path(debug_dir).rglob("*") if p.is_file()]
    ok = err <= TOLERANCES["float32"]
    print(f"model            {spec.name} ({spec.suite}), backend {args.backend!r}, CPU, float32")
    print(f"correct          {'yes' if ok else 'NO'} (relative error {err:.2e} against eager)")
    print(f"eager            {eager_s * 1e3:.2f} ms")
    print(f"kiln             {kiln_s * 1e3:.2f} ms   speedup {eager_s / kiln_s:.2f}x")
    print(f"compile time     {max(0.0, first_call_s - kiln_s):.2f} s (first call minus a step)")
    kinds = f" {dict(s.graph_break_kinds)}" if s.graph_breaks else ""
    print(f"graphs           {s.graphs_compiled}, graph breaks {s.graph_breaks}{kinds}")
    print(f"kernels          {dict(s.kernels) or 'none'}")
    print(f"fallback ops     {dict(s.fallback_ops) or 'none'}")
    if s.graphs_compiled == 0:
        print("eager fallbacks  nothing was compiled: the model ran eagerly")
    elif s.eager_fallbacks:
        print(f"eager fallbacks  {s.eager_fallbacks} graph(s) failed to compile and ran eagerly")
    else:
        print("eager fallbacks  none")
    print(f"generated code   {debug_dir} ({len(files)} files)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
