"""Warm start: each model's first call with empty compile caches, then again in a fresh
process reusing them, for Kiln and for torch.compile, side by side.

``python -m benchmarks.warm_start [--models ...] [--device cuda] [--jobs 4]``. For every model
and column (``kiln``, ``torch_compile``) a fresh cache folder (``KILN_CACHE_DIR``,
``KILN_GRAPH_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``) gets two child
processes in turn
(``benchmarks.worker`` in its ``warm`` phase: build the model, run eager once, compile, time the
first call and check it against eager): the first finds the folder empty (``cold_s``), the
second finds what the first left there (``warm_s``). Imports and the eager run are not timed,
only the first compiled call, compiles included. ``--repeat N`` does it N times, each with a
new folder, and keeps the minima (for a shared machine).

``--jobs N`` runs N such (model, column) pairs at once (each child gets ``cpus / N`` torch
threads); concurrent children share the CPUs, so use it to fit a time limit, with N small
against the core count. Writes ``warm_start.csv`` and ``warm_start.md`` under ``--out`` after
each pair; the table marks a model ``yes`` when Kiln's warm first call is at most 15% of its
cold one and at most torch.compile's warm one. ``--budget`` stops starting pairs after that
many seconds, and gives a child started late only what is left of it and a minute.
``--merge A.csv B.csv --out DIR`` makes one table of shards (``--shard i/n``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import models
from benchmarks.runner import _CACHE_VARS, ROOT

__all__ = ["main", "measure_pair", "table"]

COLUMNS = ("kiln", "torch_compile")
WARM_SHARE = 0.15  # Kiln's warm first call, at most this share of its cold one


def _first_call(job: dict[str, Any], cache: Path, timeout_s: float) -> dict[str, Any]:
    """One child process: the worker's warm-phase result row (first call time, error)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in _CACHE_VARS:
        env[var] = str(cache / var.lower())
    with tempfile.TemporaryDirectory() as work:
        events = Path(work) / "events.jsonl"
        spec = Path(work) / "job.json"
        spec.write_text(json.dumps({**job, "events": str(events)}))
        try:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.worker", str(spec)],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"reason": f"no result within {timeout_s:g} s"}
        lines = events.read_text().splitlines() if events.exists() else []
    rows = [json.loads(ln) for ln in lines if ln.strip()]
    row = next((r for r in rows if r["event"] == "result"), None)
    if row is None:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return {"reason": f"crashed: {tail[0][:300]}"}
    return row


def measure_pair(model: str, column: str, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Cold and warm first-call seconds of one model under one column (minima over repeats)."""
    job = {"model": model, "backends": [column], "device": args.device, "mode": args.mode}
    job |= {"dtype": args.dtype, "phase": "warm", "threads": threads}
    if args.preset:
        job["preset"] = args.preset
    out: dict[str, Any] = {"model": model, "column": column}
    timeout_s = args.timeout
    if args.stop_at is not None:  # a pair started late gets what is left, and a grace
        timeout_s = max(30.0, min(timeout_s, args.stop_at + 60 - time.monotonic()))
    for _ in range(args.repeat):
        cache = Path(tempfile.mkdtemp(prefix=f"warm-{model}-{column}-", dir=args.cache_root))
        try:
            for phase in ("cold", "warm"):
                row = _first_call(job, cache, timeout_s)
                seconds = row.get("first_call_s")
                if seconds is None or row.get("status") == "failed":
                    out["reason"] = row.get("reason") or f"{phase}: no time"
                    return out
                out[f"{phase}_s"] = min(seconds, out.get(f"{phase}_s", seconds))
                out["rel_error"] = row.get("rel_error")
                if row.get("graph_cache_hits") is not None:  # Kiln's: all hits when warm
                    out[f"{phase}_hits"] = row["graph_cache_hits"]
                    out[f"{phase}_misses"] = row["graph_cache_misses"]
                if row.get("compile_seconds"):  # Kiln's: where the first call's time went
                    out[f"{phase}_phases"] = _largest(row["compile_seconds"])
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return out


def _largest(seconds: dict[str, float], n: int = 6) -> str:
    """The ``n`` longest compile phases, as ``name=seconds`` (for the CSV)."""
    top = sorted(seconds.items(), key=lambda kv: -kv[1])[:n]
    return " ".join(f"{name}={value:.2f}" for name, value in top)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table: per model, both columns' cold and warm seconds, and the verdict."""
    by = {(r["model"], r["column"]): r for r in rows}
    lines = [
        "| model | kiln cold s | kiln warm s | warm/cold | torch.compile cold s | "
        "torch.compile warm s | met |",
        "|---|---|---|---|---|---|---|",
    ]
    met = 0
    names = list(dict.fromkeys(r["model"] for r in rows))
    for name in names:
        k, t = by.get((name, "kiln"), {}), by.get((name, "torch_compile"), {})
        share = k["warm_s"] / k["cold_s"] if k.get("warm_s") and k.get("cold_s") else None
        ok = share is not None and share <= WARM_SHARE
        ok = ok and (t.get("warm_s") is None or k["warm_s"] <= t["warm_s"])
        met += ok
        why = "; ".join(r["reason"] for r in (k, t) if r.get("reason"))
        lines.append(
            f"| {name} | {_fmt(k.get('cold_s'))} | {_fmt(k.get('warm_s'))} | "
            f"{'-' if share is None else f'{100 * share:.0f}%'} | {_fmt(t.get('cold_s'))} | "
            f"{_fmt(t.get('warm_s'))} | {'yes' if ok else 'no'}{f' ({why})' if why else ''} |"
        )
    lines.append("")
    lines.append(
        f"{met}/{len(names)} models: Kiln's warm first call at most "
        f"{100 * WARM_SHARE:.0f}% of its cold one and at most torch.compile's warm one."
    )
    return "\n".join(lines) + "\n"


def _write(out: Path, rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fields = ["model", "column", "cold_s", "warm_s", "rel_error", "warm_hits", "warm_misses"]
    fields += ["reason", "cold_phases", "warm_phases"]
    with (out / "warm_start.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (out / "warm_start.md").write_text(table(rows))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.warm_start", description=__doc__)
    p.add_argument("--models", nargs="*", help="names or suites (default: the whole suite)")
    p.add_argument("--columns", default=",".join(COLUMNS))
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--mode", choices=["inference", "training"], default="inference")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "amp"], default="float32")
    p.add_argument("--preset", choices=models.PRESETS, help="model sizes (default: by device)")
    p.add_argument("--jobs", type=int, default=1, help="(model, column) pairs run at once")
    p.add_argument("--repeat", type=int, default=1, help="cold+warm rounds; minima are kept")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds per child process")
    p.add_argument("--budget", type=float, help="start no pair after this many seconds")
    p.add_argument("--shard", help="i/n: every n-th model starting at the i-th")
    p.add_argument("--cache-root", type=Path, help="where the fresh cache folders go")
    p.add_argument("--out", type=Path, default=Path("bench-results/warm-start"))
    p.add_argument("--merge", nargs="+", type=Path, help="shards' warm_start.csv: one table")
    return p.parse_args(argv)


_TEXT_FIELDS = ("model", "column", "reason", "cold_phases", "warm_phases")


def _merge(paths: list[Path], out: Path) -> int:
    """One table from the ``warm_start.csv`` of several shards (a later row wins)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        with path.open() as f:
            for row in csv.DictReader(f):
                parsed = {
                    k: v if k in _TEXT_FIELDS else float(v) if v else None for k, v in row.items()
                }
                rows[(row["model"], row["column"])] = {
                    k: v for k, v in parsed.items() if v is not None and v != ""
                }
    _write(out, list(rows.values()))
    print(table(list(rows.values())))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        return _merge(args.merge, args.out)
    args.preset = args.preset or ("gpu" if args.device == "cuda" else "cpu")
    names = [s.name for s in models.select(args.models or None)]
    if args.shard:
        i, _, n = args.shard.partition("/")
        names = names[int(i) - 1 :: int(n)]
    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    threads = max(1, len(os.sched_getaffinity(0)) // max(1, args.jobs))
    if args.cache_root:
        args.cache_root.mkdir(parents=True, exist_ok=True)
    stop_at = args.stop_at = time.monotonic() + args.budget if args.budget else None
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(model: str, column: str) -> None:
        if stop_at is not None and time.monotonic() > stop_at:
            row = {"model": model, "column": column, "reason": "not run: budget spent"}
        else:
            row = measure_pair(model, column, args, threads)
        with lock:
            rows.append(row)
            rows.sort(key=lambda r: (names.index(r["model"]), columns.index(r["column"])))
            _write(args.out, rows)
            print(json.dumps(row), flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for future in [pool.submit(one, m, c) for m in names for c in columns]:
            future.result()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
