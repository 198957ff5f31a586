"""BERT and GPT-2 inference over changing sequence lengths: Kiln with ``dynamic=True`` against
eager, torch.compile with ``dynamic=True`` and Kiln's static graph for each length.

One run, every column in one process. For each model the sweep calls each column once per
sequence length, in order, from a fresh compiler state: ``total_s`` is the wall time of that
sweep, compiles included (what a server meeting new lengths pays). Then, per length, the
steady-state time of one call (``benchmarks.measure.interleaved_medians``: the columns take
turns, so load on a shared machine drifts into all alike), and ``kiln_dyn / kiln_static``,
Kiln's symbolic graph against the graph Kiln compiles for that length alone.

``python -m benchmarks --dynamic-seq`` runs it (``nox -s bench -- --dynamic-seq``);
``--preset tiny`` takes 2-layer models of hidden size 64 for a smoke run, ``--models bert``
one model, ``--device cuda`` the GPU (Triton kernels). ``first_s`` is each column's first call
at each length: for ``kiln_dyn`` the first length's compiles the symbolic graph and later ones
should cost a steady call; for ``kiln_static`` every length compiles a graph of its own, so
``kiln_dyn``'s first ``first_s`` against ``kiln_static``'s at the first length is the
compile-time ratio of a dynamic graph to a static one, both building their kernels from
nothing; against the median of ``kiln_static``'s, it also counts that a static graph for a
later length reuses kernels (such as Triton binaries) built for earlier ones. The table also counts the graphs ``kiln_dyn``
compiled per size because the backend declined their symbolic sizes (0 when it compiled once).

In one process the column compiled second profits from what the first left warm (the compile
workers' imports, memos of op layouts, lazily built tables), so the order of the columns moves
that ratio. The ratio the table calls fair is measured apart, in fresh processes: each runs
the warm-up below, then one first call of one model at the first length, ``kiln_dyn`` and
``kiln_static`` alternating, ``--fresh-repeats`` times each (minima kept).

Both sides of the in-process ratio compile, from the same start: the run points ``KILN_CACHE_DIR``,
``KILN_GRAPH_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` at fresh temporary
folders (unless ``--keep-caches``), so no column loads a program or a library an earlier run
left on disk; and before any model a small unrelated graph goes through each compiler once,
statically and with symbolic sizes alike, so the process's one-time costs (imports, the C++
compiler's probe, torch's decomposition tables, sympy's first expressions) fall on neither
column's first compile. What stays in the ratio is per-graph work. Columns: ``eager``,
``kiln_dyn`` (``dynamic=True``, symbolic kernels:
``options={"dynamic_kernels": True}``), ``kiln_static`` (``dynamic=False``, one graph per
length), ``torch_compile`` (``dynamic=True``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.measure import interleaved_medians

__all__ = ["LENGTHS", "main", "run_model"]

LENGTHS = (17, 24, 33, 48, 64, 77, 96, 128)
_BATCH = 2


def _model(name: str, preset: str) -> torch.nn.Module:
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    tiny = preset == "tiny"
    if name == "bert":
        cfg = (
            BertConfig(
                hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
            )
            if tiny
            else BertConfig()
        )
        return BertModel(cfg).eval()
    cfg2 = GPT2Config(n_embd=64, n_layer=2, n_head=2) if tiny else GPT2Config()
    return GPT2Model(cfg2).eval()


def _columns(model: torch.nn.Module) -> dict[str, Callable[[torch.Tensor], Any]]:
    import kiln

    dyn = kiln.compile(model, dynamic=True, options={"dynamic_kernels": True})
    cols: dict[str, Callable[[torch.Tensor], Any]] = {"eager": model, "kiln_dyn": dyn}
    statics: dict[int, Any] = {}

    def kiln_static(ids: torch.Tensor) -> Any:
        # a graph compiled for this length alone: a fresh compiled function per length
        fn = statics.get(ids.shape[1])
        if fn is None:
            fn = statics[ids.shape[1]] = kiln.compile(model, dynamic=False)
        return fn(ids)

    cols["kiln_static"] = kiln_static
    cols["torch_compile"] = torch.compile(model, dynamic=True)
    return cols


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_model(name: str, preset: str, iters: int, device: str = "cpu") -> list[dict[str, Any]]:
    """One row per (column, length): steady-state and first-call seconds, each column's sweep."""
    import kiln
    from kiln.capture import counters as kiln_stats

    torch.manual_seed(0)
    model = _model(name, preset).to(device)
    vocab = 1000
    inputs = {n: torch.randint(0, vocab, (_BATCH, n), device=device) for n in LENGTHS}
    kiln.reset()
    torch._dynamo.reset()
    cols = _columns(model)
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        totals: dict[str, float] = {}
        firsts: dict[tuple[str, int], float] = {}
        per_size = 0
        for col, fn in cols.items():
            _sync(device)
            start = time.perf_counter()
            for n in LENGTHS:
                began = time.perf_counter()
                fn(inputs[n])
                _sync(device)
                firsts[col, n] = time.perf_counter() - began
            totals[col] = time.perf_counter() - start
            print(f"# {name} {col}: sweep {totals[col]:.1f} s", file=sys.stderr, flush=True)
            if col == "kiln_dyn":  # graphs the backend could not compile symbolically
                per_size = kiln_stats.snapshot().get("stats", {}).get("size_specializations", 0)
        for n in LENGTHS:
            steps: dict[str, Callable[[], Any]] = {
                col: functools.partial(fn, inputs[n]) for col, fn in cols.items()
            }
            medians = interleaved_medians(steps, device, iters, budget_s=2.0)
            for col, seconds in medians.items():
                rows.append(
                    {
                        "model": name,
                        "length": n,
                        "column": col,
                        "call_s": seconds,
                        "first_s": firsts[col, n],
                        "total_s": totals[col],
                        "kiln_dyn_per_size": per_size,
                    }
                )
    return rows


def _first_call(name: str, preset: str, device: str, mode: str) -> float:
    """In this (fresh) process: the warm-up, then ``name``'s first compiled call."""
    import kiln

    torch.manual_seed(0)
    model = _model(name, preset).to(device)
    ids = torch.randint(0, 1000, (_BATCH, LENGTHS[0]), device=device)
    with torch.no_grad():
        model(ids)
        _warm_up(device)
        compiled = kiln.compile(model, dynamic=mode == "dyn", options={"dynamic_kernels": True})
        _sync(device)
        start = time.perf_counter()
        compiled(ids)
        _sync(device)
    return time.perf_counter() - start


def fresh_compiles(name: str, preset: str, device: str, repeats: int) -> dict[str, float]:
    """``{"kiln_dyn": s, "kiln_static": s}``: minima over ``repeats`` fresh processes each,
    alternating, every process with empty caches of its own."""
    best: dict[str, float] = {}
    for _ in range(repeats):
        for mode in ("static", "dyn"):
            with tempfile.TemporaryDirectory(prefix="kiln-first-call-") as root:
                env = {**os.environ, **{v: os.path.join(root, v.lower()) for v in _CACHE_VARS}}
                argv = ["--first-call", mode, "--models", name, "--preset", preset]
                done = subprocess.run(
                    [sys.executable, "-m", "benchmarks.dynamic_seq", *argv, "--device", device],
                    env=env, capture_output=True, text=True, check=True, timeout=900,
                )  # fmt: skip
            seconds = float(done.stdout.split("FIRST_CALL_S")[-1].split()[0])
            key = f"kiln_{mode}"
            best[key] = min(best.get(key, seconds), seconds)
    return best


def _table(rows: list[dict[str, Any]]) -> str:
    cols = list(dict.fromkeys(r["column"] for r in rows))
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        total = {r["column"]: r["total_s"] for r in mine}
        out.append(f"## {model}: sweep over {len(LENGTHS)} lengths, compiles included (s)")
        out.append(" | ".join(f"{c} {total[c]:.2f}" for c in cols))
        first = {(r["column"], r["length"]): r["first_s"] for r in mine}
        static = statistics.median(first["kiln_static", n] for n in LENGTHS)
        dyn = first["kiln_dyn", LENGTHS[0]]
        later = max(first["kiln_dyn", n] for n in LENGTHS[1:])
        out.append("")
        first_static = first["kiln_static", LENGTHS[0]]
        out.append(
            f"compile (first call): kiln_dyn {dyn:.2f} s; kiln_static {first_static:.2f} s at "
            f"the first length (its kernels built from nothing), ratio "
            f"{dyn / first_static:.2f}; kiln_static median {static:.2f} s per length (later "
            f"lengths reuse kernels built for earlier ones), ratio {dyn / static:.2f}; "
            f"kiln_dyn's slowest later first call "
            f"{later * 1e3:.1f} ms; kiln_dyn graphs compiled per size instead "
            f"{mine[0]['kiln_dyn_per_size']}"
        )
        fresh = mine[0].get("fresh")
        if fresh:
            out.append("")
            out.append(
                f"compile in fresh processes (each: the warm-up, then the first call at length "
                f"{LENGTHS[0]}; minima): kiln_dyn {fresh['kiln_dyn']:.2f} s; kiln_static "
                f"{fresh['kiln_static']:.2f} s; ratio {fresh['kiln_dyn'] / fresh['kiln_static']:.2f}"
            )
        out.append("")
        out.append("| length | " + " | ".join(f"{c} ms" for c in cols) + " | dyn/static |")
        out.append("|---" * (len(cols) + 2) + "|")
        for n in LENGTHS:
            per = {r["column"]: r["call_s"] for r in mine if r["length"] == n}
            ratio = per["kiln_dyn"] / per["kiln_static"]
            cells = " | ".join(f"{per[c] * 1e3:.2f}" for c in cols)
            out.append(f"| {n} | {cells} | {ratio:.2f} |")
        out.append("")
    return "\n".join(out)


def _warm_up(device: str) -> None:
    """One small graph through each compiler first, static and symbolic, so no column's first
    compile pays for the process's one-time start (imports, compile workers, the C++
    compiler's probe, CUDA libraries, the symbolic path's decomposition tables and sympy)."""
    import kiln

    mlp = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).to(device)
    x = torch.randn(4, 5, 16, device=device)
    with torch.no_grad():
        kiln.compile(mlp)(x)
        kiln.compile(mlp, dynamic=True, options={"dynamic_kernels": True})(x)
        torch.compile(mlp)(x)
        torch.compile(mlp, dynamic=True)(x)
    kiln.reset()
    torch._dynamo.reset()
    _sync(device)


_CACHE_VARS = (
    "KILN_CACHE_DIR",
    "KILN_GRAPH_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
)


def _fresh_caches(root: str) -> None:
    """Every compiler's on-disk cache in a new folder under ``root`` (set before any compile)."""
    for var in _CACHE_VARS:
        os.environ[var] = os.path.join(root, var.lower())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks --dynamic-seq", description=__doc__)
    p.add_argument("--preset", choices=["tiny", "base"], default="base")
    p.add_argument("--models", nargs="*", default=["bert", "gpt2"], choices=["bert", "gpt2"])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--keep-caches",
        action="store_true",
        help="use the compilers' usual cache folders (a repeated run then loads what it compiled)",
    )
    p.add_argument(
        "--fresh-repeats",
        type=int,
        default=2,
        help="fresh processes per column timing one first call each (0: none)",
    )
    p.add_argument("--first-call", choices=["static", "dyn"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.first_call:  # a child of fresh_compiles
        seconds = _first_call(args.models[0], args.preset, args.device, args.first_call)
        print(f"FIRST_CALL_S {seconds:.4f}", flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="kiln-dynamic-seq-") as root:
        if not args.keep_caches:
            _fresh_caches(root)
        _warm_up(args.device)
        for m in args.models:  # each model's table as soon as it is measured
            rows = run_model(m, args.preset, args.iters, args.device)
            if args.fresh_repeats:
                fresh = fresh_compiles(m, args.preset, args.device, args.fresh_repeats)
                rows[0]["fresh"] = fresh
            print(_table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
