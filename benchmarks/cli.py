"""``python -m benchmarks``: the suite under each backend, side by side, with reports.

Example: ``python -m benchmarks --models resnet18 hf_bert --backends eager,kiln,torch_compile``.
Writes results.csv, summary.md, speedups.png, distribution.png and meta.json under ``--out``.
``python -m benchmarks --dynamic-seq`` runs :mod:`benchmarks.dynamic_seq` instead.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

from benchmarks import models
from benchmarks.report import write_reports
from benchmarks.runner import RunConfig, run_suite
from benchmarks.worker import strict_float32

__all__ = ["machine_meta", "main", "parse_args"]

DEFAULT_BACKENDS = "eager,kiln,aot_eager,torch_compile"


def _shard(text: str) -> tuple[int, int]:
    index, _, total = text.partition("/")
    i, n = int(index), int(total)
    if not 1 <= i <= n:
        msg = f"--shard {text!r}: want i/n with 1 <= i <= n"
        raise argparse.ArgumentTypeError(msg)
    return i, n


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--preset", choices=models.PRESETS, help="model sizes (default: by device)")
    p.add_argument(
        "--models",
        nargs="*",
        help="names or suites (timm, huggingface, handwritten; breadth, breadth-cpu)",
    )
    p.add_argument("--mode", choices=["inference", "training"], default="inference")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "amp"], default="float32")
    p.add_argument("--backends", default=DEFAULT_BACKENDS, help="comma-separated columns")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per model and backend")
    p.add_argument("--budget", type=float, help="seconds for the run; later models are skipped")
    p.add_argument("--cache-dir", type=Path, help="compile caches (default: OUT/cache)")
    p.add_argument("--shard", type=_shard, help="i/n: run every n-th model starting at i")
    p.add_argument(
        "--iters", type=int, default=10, help="timed rounds, each one step of every backend"
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-warm", action="store_true", help="skip warm compile times")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    return p.parse_args(argv)


def machine_meta(args: argparse.Namespace) -> dict[str, Any]:
    """Where and with what the numbers were taken."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    meta: dict[str, Any] = {
        "device": args.device,
        "preset": args.preset,
        "mode": args.mode,
        "dtype": args.dtype,
        "cpu": f"{cpu} ({len(os.sched_getaffinity(0))} cores)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if args.device == "cuda" and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    if strict_float32(args.device, args.dtype, args.mode):
        meta["cudnn"] = "float32 convolutions without TF32"
    try:
        import kiln

        meta["kiln"] = kiln.__version__
    except ImportError:
        meta["kiln"] = "not importable"
    if args.shard:
        meta["shard"] = "{}/{}".format(*args.shard)
    return meta


def main(argv: list[str] | None = None) -> int:
    rest = sys.argv[1:] if argv is None else argv
    if "--dynamic-seq" in rest:  # BERT and GPT-2 over sequence lengths (benchmarks.dynamic_seq)
        from benchmarks import dynamic_seq

        return dynamic_seq.main([a for a in rest if a != "--dynamic-seq"])
    args = parse_args(argv)
    args.preset = args.preset or ("gpu" if args.device == "cuda" else "cpu")
    specs = models.select([m for item in args.models or [] for m in item.split(",") if m] or None)
    if args.list:
        for s in specs:
            print(f"{s.suite:12} {s.name}")
        return 0
    if args.shard:
        i, n = args.shard
        specs = specs[i - 1 :: n]
    cfg = RunConfig(
        backends=[b.strip() for b in args.backends.split(",") if b.strip()],
        out=args.out,
        device=args.device,
        dtype=args.dtype,
        mode=args.mode,
        preset=args.preset,
        timeout_s=args.timeout,
        budget_s=args.budget,
        cache_dir=args.cache_dir,
        warm=not args.no_warm,
        iters=args.iters,
        threads=args.threads,
    )
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:  # a bare GPU machine: run without the bar
        rows = run_suite(specs, cfg)
    else:
        bar = tqdm(total=len(specs), unit="model", disable=args.no_progress, file=sys.stderr)

        def advance(name: str) -> None:
            bar.set_postfix_str(name)
            bar.update()

        rows = run_suite(specs, cfg, advance)
        bar.close()
    write_reports(args.out, rows, machine_meta(args))
    print(f"wrote {args.out}/summary.md, results.csv, speedups.png and distribution.png")
    return 0
