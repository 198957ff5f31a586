"""Runs the zoo: every model in a child process of its own, with a timeout.

``--merge-into FOLDER`` re-runs some models (``--only``) and merges their rows into an earlier
run's results there (see :func:`benchmarks.zoo.report.merge`), rewriting its report, so a fix
to a few models does not need the whole zoo run again.

The parent imports torch, timm, transformers and Kiln once and forks one child per model, so a
child starts in milliseconds instead of re-importing them; a crash or a hang loses that model
alone. The child builds the model (a model that cannot be built, or whose eager forward fails,
is recorded as skipped with the reason) and runs it in eval and then train mode under each
compiler, appending one JSON line per result to a file the parent reads when the child ends, so
a timeout keeps what finished before it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import multiprocessing
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["COMPILERS", "MODES", "build", "model_ids", "run_zoo", "versions"]

COMPILERS = ("kiln", "torch.compile")
MODES = ("eval", "train")


def model_ids() -> list[str]:
    """``timm:<family>`` for every timm family and ``hf:<model type>`` for transformers."""
    from benchmarks.zoo import hf_zoo, timm_zoo

    return [f"timm:{f}" for f in timm_zoo.families()] + [f"hf:{a}" for a in hf_zoo.architectures()]


def build(model_id: str) -> Any:
    """The zoo's model for ``model_id`` (a :class:`~benchmarks.zoo.spec.Built`)."""
    from benchmarks.zoo import hf_zoo, timm_zoo

    source, name = model_id.split(":", 1)
    return timm_zoo.build(name) if source == "timm" else hf_zoo.build(name)


def versions() -> dict[str, str]:
    """The versions a zoo run depends on, for its report."""
    import timm
    import torch
    import transformers

    import kiln

    return {
        "kiln": kiln.__version__,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _append(path: Path, event: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(event) + "\n")


def _child(model_id: str, compilers: tuple[str, ...], events: Path) -> None:
    import warnings

    import torch

    from benchmarks.zoo.check import check

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    try:
        built = build(model_id)
    except Exception as e:
        _append(events, {"event": "skipped", "reason": f"{type(e).__name__}: {e}"[:1000]})
        return
    params = sum(p.numel() for p in built.model.parameters())
    inputs = {k: [v.kind, list(v.shape)] for k, v in built.inputs.items()}
    built_event = {"event": "built", "variant": built.variant, "params": params, "inputs": inputs}
    if built.train_inputs:
        train = {k: [v.kind, list(v.shape)] for k, v in built.train_inputs.items()}
        built_event["train_inputs"] = train
    _append(events, built_event)
    for mode in MODES:
        for compiler in compilers:
            _append(events, {"event": "start", "compiler": compiler, "mode": mode})
            o = check(built, compiler, mode)
            _append(events, {"event": "result", **dataclasses.asdict(o), "one_graph": o.one_graph})


def _collect(model_id: str, events: Path, status: str) -> dict[str, Any]:
    row: dict[str, Any] = {"id": model_id, "status": status, "outcomes": []}
    lines = events.read_text().splitlines() if events.exists() else []
    started = None
    for line in lines:
        e = json.loads(line)
        kind = e.pop("event")
        if kind == "skipped":
            row.update(status="skipped", reason=e["reason"])
        elif kind == "built":
            row.update(e)
        elif kind == "start":
            started = e
        elif kind == "result":
            row["outcomes"].append(e)
            started = None
    if started is not None:  # the child died or timed out in this one
        row["outcomes"].append(
            {**started, "error": status, "one_graph": False, "matches": False, "graphs": 0}
        )
    if status != "ok" and "variant" not in row and row["status"] != "skipped":
        row["status"] = "skipped"
        row["reason"] = f"{status} while building"
    return row


def run_zoo(
    ids: list[str],
    workers: int,
    timeout_s: float,
    compilers: tuple[str, ...] = COMPILERS,
    budget_s: float | None = None,
    progress: bool = True,
    on_row: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every model of ``ids`` (``workers`` at a time) and return one row per model.

    ``on_row`` sees the rows so far after each model, so a run stopped from outside keeps them.
    """
    ctx = multiprocessing.get_context("fork")
    stop_at = time.monotonic() + budget_s if budget_s else None
    pending = list(ids)
    running: dict[str, tuple[Any, Path, float]] = {}
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="kiln-zoo-"))
    while pending or running:
        while pending and len(running) < workers:
            if stop_at is not None and time.monotonic() > stop_at:
                rows += [{"id": m, "status": "not run", "outcomes": []} for m in pending]
                pending = []
                break
            model_id = pending.pop(0)
            events = tmp / (model_id.replace(":", "_").replace("/", "_") + ".jsonl")
            proc = ctx.Process(target=_child, args=(model_id, compilers, events), daemon=True)
            proc.start()
            running[model_id] = (proc, events, time.monotonic())
        time.sleep(0.05)
        for model_id, (proc, events, began) in list(running.items()):
            if proc.is_alive() and time.monotonic() - began < timeout_s:
                continue
            status = "ok"
            if proc.is_alive():
                proc.kill()
                status = "timeout"
            proc.join()
            if status == "ok" and proc.exitcode != 0:
                status = f"crashed (exit {proc.exitcode})"
            row = _collect(model_id, events, status)
            rows.append(row)
            del running[model_id]
            if on_row is not None:
                on_row(rows)
            if progress:
                summary = " ".join(
                    f"{o['compiler']}/{o['mode']}:{o.get('graphs', 0)}g{o.get('breaks', 0)}b"
                    f"{'' if o.get('matches') or o.get('compiled_path') else '!'}"
                    for o in row["outcomes"]
                )
                print(f"[{len(rows)}/{len(ids)}] {model_id} {row['status']} {summary}", flush=True)
    order = {m: i for i, m in enumerate(ids)}
    return sorted(rows, key=lambda r: order[r["id"]])


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__)
    p.add_argument("--only", action="append", help="fnmatch pattern on ids (timm:*, hf:bert)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per model")
    p.add_argument("--budget", type=float, default=None, help="start no model after this")
    p.add_argument("--shard", default="1/1", help="I/N: every N-th model from the I-th")
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--out", type=Path, default=None, help="folder for zoo.json and zoo.md")
    p.add_argument("--docs", type=Path, default=None, help="also write the docs page here")
    p.add_argument(
        "--merge-into",
        type=Path,
        default=None,
        help="put this run's rows in place of theirs in an earlier run's folder and rewrite its "
        "report (the report names the models re-run and their versions)",
    )
    args = p.parse_args(argv)
    if args.merge_into is not None and (args.out is not None or args.shard != "1/1"):
        p.error("--merge-into writes into the earlier run's folder: no --out or --shard with it")
    if args.merge_into is not None and not any(args.merge_into.glob("zoo*.json")):
        p.error(f"--merge-into: {args.merge_into} holds no zoo*.json of an earlier run")

    # imported once here so that every forked child starts with them loaded
    import timm  # noqa: F401
    import torch._dynamo  # noqa: F401
    import transformers  # noqa: F401

    import kiln  # noqa: F401
    from benchmarks.zoo import report

    ids = model_ids()
    if args.only:
        ids = [m for m in ids if any(fnmatch.fnmatch(m, pat) for pat in args.only)]
    index, count = map(int, args.shard.split("/"))
    ids = ids[index - 1 :: count]
    started = time.time()
    meta = {**versions(), "cpus": str(os.cpu_count())}
    given = sys.argv[1:] if argv is None else argv
    meta["command"] = shlex.join(["python", "-m", "benchmarks.zoo", *given])
    compilers = tuple(args.compilers.split(","))
    if args.merge_into is not None:
        rows = run_zoo(ids, args.workers, args.timeout, compilers, args.budget)
        meta["seconds"] = f"{time.time() - started:.0f}"
        report.merge(args.merge_into, rows, meta)
        report.write(args.merge_into, args.docs)
        return 0
    out = args.out or Path("benchmarks/results") / versions()["kiln"] / "zoo"
    out.mkdir(parents=True, exist_ok=True)
    name = "zoo.json" if args.shard == "1/1" else f"zoo-{index}of{count}.json"

    def save(rows: list[dict[str, Any]]) -> None:
        meta["seconds"] = f"{time.time() - started:.0f}"
        (out / name).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    save(run_zoo(ids, args.workers, args.timeout, compilers, args.budget, on_row=save))
    report.write(out, args.docs)
    return 0
