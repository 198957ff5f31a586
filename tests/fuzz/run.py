"""The long fuzzing run: ``python -m fuzz.run --examples 20000`` (the nox session ``fuzz``).

Unlike the bounded test, a finding does not stop the run: each one is shrunk, grouped with
those of the same signature, and written as a repro file; the run ends with a summary of
programs compared, programs eager rejected, fallbacks and findings. The program being run is
kept as ``running/repro_000.py`` under the repro folder until the run ends, so a process that
crashes (a segmentation fault in a generated kernel) leaves the program that crashed it.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

from .harness import run_program
from .programs import BACKENDS, Program, programs
from .triage import shrink, signature, write_repro


def _reproduces(repro: Path) -> bool:
    """Whether a repro file fails on its own: a finding that needs earlier programs in the same
    process points at state Kiln keeps between compilations."""
    try:
        done = subprocess.run(
            [sys.executable, str(repro)], capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired:
        return True
    return "finding=None" not in done.stdout


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=1000, help="programs to generate")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed")
    parser.add_argument("--out", type=Path, default=Path("fuzz-findings"), help="repro folder")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma list")
    parser.add_argument("--no-shrink", action="store_true", help="write findings as found")
    args = parser.parse_args(argv)
    backends = tuple(args.backends.split(","))
    counts: collections.Counter[str] = collections.Counter()
    seen: dict[str, Path] = {}
    fallbacks: collections.Counter[str] = collections.Counter()
    more: collections.Counter[str] = collections.Counter()
    start = time.time()
    running = args.out / "running"

    @seed(args.seed)
    @settings(
        max_examples=args.examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(programs(backends=backends))
    def one(program: Program) -> None:
        write_repro(
            running,
            0,
            program.source,
            program.calls,
            program.backend,
            program.grad,
            "crash: the fuzzing process died running this program",
        )
        try:
            outcome = run_program(program.source, program.calls, program.backend, program.grad)
        except Exception as e:  # the harness's own failure: report it, keep going
            counts["harness errors"] += 1
            print(f"HARNESS ERROR {type(e).__name__}: {e}\n{program.describe()}", flush=True)
            return
        counts["generated"] += 1
        counts["invalid" if outcome.invalid else "compared"] += 1
        counts[
            f"compared with {program.backend}{' + grad' if program.grad else ''}"
        ] += not outcome.invalid
        for message in set(outcome.fallbacks):
            fallbacks[signature(message)] += 1
        if outcome.finding is not None:
            counts["findings"] += 1
            key = f"{program.backend}/{program.grad}/{signature(outcome.finding)}"
            more[key] += 1
            if key in seen and more[key] <= 20:
                # Findings beside the first of a signature may have another cause: keep a few.
                write_repro(
                    args.out / "more",
                    len(seen) * 100 + more[key],
                    program.source,
                    program.calls,
                    program.backend,
                    program.grad,
                    outcome.finding,
                )
            if key not in seen:
                source, calls = program.source, program.calls
                if not args.no_shrink and outcome.kind is not None:
                    source, calls = shrink(
                        source, calls, program.backend, program.grad, outcome.kind
                    )
                seen[key] = write_repro(
                    args.out,
                    len(seen),
                    source,
                    calls,
                    program.backend,
                    program.grad,
                    outcome.finding,
                )
                fresh = "reproduces" if _reproduces(seen[key]) else "does NOT reproduce"
                print(
                    f"FINDING {seen[key]} ({fresh} in a fresh process): "
                    f"{outcome.finding.splitlines()[0]}",
                    flush=True,
                )
        if counts["generated"] % 100 == 0:
            rate = counts["generated"] / (time.time() - start)
            print(f"{dict(counts)} ({rate:.2f} programs/s)", flush=True)

    # A run in the background ignores SIGINT; SIGTERM stops it with its summary too.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        one()
    except KeyboardInterrupt:  # a long run stopped by hand still reports what it saw
        print("interrupted")
    shutil.rmtree(running, ignore_errors=True)
    print(f"done in {time.time() - start:.0f} s: {dict(counts)}")
    for key, path in seen.items():
        print(f"  {path}: {key}")
    print("fallbacks to eager (Kiln failures that still gave eager's answer):")
    for message, count in fallbacks.most_common(30):
        print(f"  {count:5d}  {message}")
    return 1 if seen else 0


if __name__ == "__main__":
    sys.exit(main())
