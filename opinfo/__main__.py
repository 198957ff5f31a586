"""``python -m opinfo``: PyTorch's CPU OpInfos compiled with Kiln's default backend against eager.

``python -m opinfo [--mode float32|bfloat16|grad ...] [--ops NAME ...] [--workers N]
[--samples N] [--json PATH]`` prints a Markdown summary and exits 1 when any op fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import sys
import time
from collections.abc import Sequence

from opinfo.check import MODES, OpResult
from opinfo.report import FAILING, summary
from opinfo.runner import SweepConfig, run_sweep
from opinfo.worker import ops_by_key

__all__ = ["main", "select"]


def select(patterns: Sequence[str] | None) -> list[str]:
    """The sweep's op names matching any of ``patterns`` (shell globs), or all of them."""
    names = sorted(ops_by_key())
    if not patterns:
        return names
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mode", choices=MODES, action="append", help="default: float32")
    parser.add_argument("--ops", nargs="+", help="op names or globs (default: every OpInfo)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--samples", type=int, default=2, help="samples per op (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per op")
    parser.add_argument("--json", help="write every op's result here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each op's result")
    args = parser.parse_args(argv)
    names = select(args.ops)
    if not names:
        parser.error(f"no OpInfo matches {args.ops}")
    results: list[OpResult] = []

    def show(r: OpResult) -> None:
        if args.verbose or r.status in FAILING:
            print(f"{r.mode} {r.op}: {r.status} {r.reason[:200]}", file=sys.stderr, flush=True)

    for mode in args.mode or ["float32"]:
        start = time.perf_counter()
        cfg = SweepConfig(
            mode=mode,
            workers=args.workers,
            samples=args.samples,
            seed=args.seed,
            timeout_s=args.timeout,
        )
        results += run_sweep(names, cfg, progress=show)
        print(f"{mode}: {len(names)} ops in {time.perf_counter() - start:.0f}s", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    print(summary(results))
    return 1 if any(r.status in FAILING for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
