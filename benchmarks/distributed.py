"""Data-parallel training throughput: DDP and FSDP2 under eager, torch.compile and Kiln.

Each rank trains a GPT-2-medium-size decoder (24 blocks, width 1024, 16 heads, vocabulary
50257, 1024 tokens) with AdamW; per setup (``ddp``: ``DistributedDataParallel``; ``fsdp2``:
``fully_shard`` per block and on the root, bfloat16 parameters through
``MixedPrecisionPolicy``) and compiler (``eager``, ``torch_compile``, ``kiln``) it reports
tokens per second over all ranks, the peak memory of rank 0, and, from a ``torch.profiler``
trace of a few steps, how much of the communication kernels' time (all-reduce for DDP,
all-gather and reduce-scatter for FSDP2) ran while a compute kernel ran on the device: the
fraction hidden under compute. DDP compiles the DDP module (``torch.compile(DDP(m))``,
``kiln.compile(DDP(m))``: both split the graph at the gradient buckets); FSDP2 compiles each
block (setup ``fsdp2_whole``, or ``--fsdp-compile whole``: the root module, FSDP2's modules
inside it).

On two GPUs (NCCL), from the repository root (``bash benchmarks/gpu_run.sh distributed``
does the same with PYTHONPATH set)::

    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\\n' ':')$PWD \\
        torchrun --nproc_per_node 2 benchmarks/distributed.py --device cuda --out OUT_DIR

or ``python benchmarks/distributed.py --device cuda --nproc 2`` (spawns the ranks itself).
With ``--out``, rank 0's profiler traces land there too (``trace-SETUP-COMPILER.json``, for
chrome://tracing or Perfetto). ``--setups`` and ``--compilers`` pick rows, so a long run can
be split over several calls. Rows run one after another in the same processes; a compiler
leaves process-wide state behind (torch.compile's caches and patches, allocator
fragmentation) that the rows after it pay for, so ``gpu_run.sh`` starts fresh ranks for each
row and merges the rows with ``--merge DIR ... --out DIR``.
``--device cpu --tiny`` runs a small model on gloo to check the script works; its
overlap figure counts CPU operator time and means little.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

COMM = re.compile(r"(?i)nccl|gloo|all_?reduce|reduce_?scatter|all_?gather|c10d")


class Block(nn.Module):
    """GPT-2's block: pre-norm causal attention and a 4x MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _config(args: argparse.Namespace) -> dict[str, int]:
    if args.tiny:
        return {"vocab": 256, "seq": 32, "dim": 64, "heads": 2, "layers": 2}
    return {"vocab": 50257, "seq": args.seq, "dim": 1024, "heads": 16, "layers": 24}


def _compiler(name: str) -> Callable[[Any], Any]:
    if name == "eager":
        return lambda m: m
    if name == "torch_compile":
        return torch.compile
    import kiln

    return kiln.compile


def _reset(name: str) -> None:
    if name == "torch_compile":
        import torch._dynamo

        torch._dynamo.reset()
    elif name == "kiln":
        import kiln

        kiln.reset()


def _build(
    setup: str, compiler: str, args: argparse.Namespace, device: torch.device
) -> tuple[Callable[..., torch.Tensor], nn.Module]:
    torch.manual_seed(0)
    model = GPT(**_config(args)).to(device)
    compile_fn = _compiler(compiler)
    if setup == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb)
        return compile_fn(ddp), model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    if setup == "fsdp2_whole" or args.fsdp_compile == "whole":
        return compile_fn(model), model
    for i, block in enumerate(model.blocks):
        model.blocks[i] = compile_fn(block)
    return model, model


def _batches(args: argparse.Namespace, device: torch.device) -> Iterator[torch.Tensor]:
    cfg = _config(args)
    gen = torch.Generator(device=device).manual_seed(1 + dist.get_rank())
    while True:
        shape = (args.batch, cfg["seq"] + 1)
        yield torch.randint(0, cfg["vocab"], shape, generator=gen, device=device)


def _step_fn(
    run: Callable[..., torch.Tensor],
    model: nn.Module,
    setup: str,
    device: torch.device,
    data: Iterator[torch.Tensor],
) -> Callable[[], float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # DDP trains under bfloat16 autocast on GPUs; FSDP2's policy casts its parameters itself
    autocast = device.type == "cuda" and setup == "ddp"

    def step() -> float:
        idx = next(data)
        ctx = torch.autocast("cuda", torch.bfloat16) if autocast else contextlib.nullcontext()
        with ctx:
            logits = run(idx[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlap_fraction(
    comm: list[tuple[float, float]], compute: list[tuple[float, float]]
) -> tuple[float, float]:
    """(communication time, fraction of it during some compute span)."""
    busy = _union(compute)
    total = hidden = 0.0
    for start, end in _union(comm):
        total += end - start
        for b0, b1 in busy:
            hidden += max(0.0, min(end, b1) - max(start, b0))
    return total, (hidden / total if total else 0.0)


def _profile(
    step: Callable[[], float], device: torch.device, steps: int, trace: Path | None
) -> dict[str, float]:
    """Communication time per step and the share of it under compute, from the trace's
    kernels (on CPU: operators; gloo's work runs on threads of its own).

    One profiled step runs first unrecorded: Kiln's compiled code builds the variant of its
    wrapper that emits profiler ranges on its first profiled call (about 2 ms a graph), which
    is no part of a steady step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with tempfile.TemporaryDirectory() as tmp:
        path = trace or Path(tmp) / "trace.json"
        with profile(
            activities=acts,
            schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
        ) as prof:
            for i in range(steps + 1):
                step()
                if i == steps:
                    _sync(device)
                prof.step()
        events = json.loads(path.read_text()).get("traceEvents", [])
    wanted = "kernel" if device.type == "cuda" else "cpu_op"
    comm: list[tuple[float, float]] = []
    compute: list[tuple[float, float]] = []
    for evt in events:
        if evt.get("cat") != wanted or "dur" not in evt:
            continue
        span = (float(evt["ts"]), float(evt["ts"]) + float(evt["dur"]))
        (comm if COMM.search(str(evt.get("name", ""))) else compute).append(span)
    total, hidden = overlap_fraction(comm, compute)
    return {"comm_ms_per_step": total / 1e3 / steps, "comm_hidden": hidden}


@contextlib.contextmanager
def _collections_timed() -> Iterator[list[float]]:
    """Seconds the garbage collector ran inside the block (``[total]``, filled in as it runs):
    a compiler whose objects make the collector slower pays for it in every step."""
    total = [0.0]
    began = [0.0]

    def note(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            total[0] += time.perf_counter() - began[0]

    gc.callbacks.append(note)
    try:
        yield total
    finally:
        gc.callbacks.remove(note)


def _measure(setup: str, compiler: str, args: argparse.Namespace, device: torch.device) -> Any:
    _reset(compiler)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    run, model = _build(setup, compiler, args, device)
    step = _step_fn(run, model, setup, device, _batches(args, device))
    start = time.perf_counter()
    for _ in range(args.warmup):
        loss = step()
    _sync(device)
    warm_s = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    segments = []  # the median segment's time: one slow one (a collection, a neighbour) is left out
    per_segment = max(1, args.steps // args.segments)
    cpu_start = time.process_time()
    with _collections_timed() as collecting:
        for _ in range(args.segments):
            start = time.perf_counter()
            for _ in range(per_segment):
                loss = step()
            _sync(device)
            segments.append(time.perf_counter() - start)
    timed_steps = per_segment * args.segments
    host_ms = (time.process_time() - cpu_start) / timed_steps * 1e3
    seconds = statistics.median(segments)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    tokens = dist.get_world_size() * args.batch * _config(args)["seq"] * per_segment
    row = {
        "setup": setup,
        "compiler": compiler,
        "tokens_per_s": tokens / seconds,
        "step_ms": seconds / per_segment * 1e3,
        "segments_tokens_per_s": [tokens / r for r in segments],
        "peak_gib": peak,
        "host_cpu_ms_per_step": host_ms,
        "gc_ms_per_step": collecting[0] / timed_steps * 1e3,
        "warmup_s": warm_s,
        "loss": loss,
    }
    if args.profile_steps:
        trace = None
        if args.out and dist.get_rank() == 0:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            trace = Path(args.out) / f"trace-{setup}-{compiler}.json"
        row.update(_profile(step, device, args.profile_steps, trace))
    if compiler == "kiln":
        import kiln

        s = kiln.stats()
        row.update(graphs=s.graphs_compiled, ddp_pieces=s.ddp_graph_pieces)
        row.update(breaks=s.graph_breaks, fallbacks=s.eager_fallbacks)
    del run, model, step
    return row


def _table(rows: list[dict[str, Any]]) -> str:
    cols = ["setup", "compiler", "tokens_per_s", "step_ms", "peak_gib", "comm_hidden"]
    cols += [
        "comm_ms_per_step",
        "host_cpu_ms_per_step",
        "gc_ms_per_step",
        "warmup_s",
        "graphs",
        "ddp_pieces",
        "breaks",
        "fallbacks",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = []
        for c in cols:
            v = row.get(c)
            cells.append("" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write(rows: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "summary.md").write_text(_table(rows) + "\n")


def merge(folders: list[str], out: str) -> None:
    """One table of the rows of several runs' ``results.json`` (in the order given), and one of
    each setup and compiler's median over the runs, with its ratios to eager and torch.compile."""
    rows: list[dict[str, Any]] = []
    metas: list[dict[str, Any]] = []
    for folder in folders:
        path = Path(folder) / "results.json"
        if not path.exists():
            print(f"{folder}: no results.json (the run did not finish)", flush=True)
            continue
        found = json.loads(path.read_text())
        rows += found["rows"]
        metas.append(found["meta"])
    meta = {"runs": metas, "separate_processes": True}
    _write(rows, meta, Path(out))
    print(_table(rows), flush=True)
    medians = median_table(rows)
    print(medians, flush=True)
    with (Path(out) / "summary.md").open("a") as f:
        f.write("\n" + medians + "\n")


def median_table(rows: list[dict[str, Any]]) -> str:
    """Per setup and compiler: the median tokens/s over repeated runs, its range, and the
    median's ratio to eager's and torch.compile's medians in the same setup."""
    runs: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        runs.setdefault((row["setup"], row["compiler"]), []).append(row["tokens_per_s"])
    median = {key: statistics.median(v) for key, v in runs.items()}
    lines = ["| setup | compiler | runs | median tokens/s | range | vs eager | vs torch.compile |"]
    lines.append("|---|---|---|---|---|---|---|")
    for (setup, compiler), values in runs.items():
        m = median[(setup, compiler)]
        ratios = [
            f"{m / median[(setup, base)]:.2f}" if (setup, base) in median else ""
            for base in ("eager", "torch_compile")
        ]
        spread = f"{min(values):,.0f}-{max(values):,.0f}"
        lines.append(
            f"| {setup} | {compiler} | {len(values)} | {m:,.0f} | {spread} | "
            + " | ".join(ratios)
            + " |"
        )
    return "\n".join(lines)


def run(rank: int, world: int, args: argparse.Namespace) -> None:
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world)
    rows = []
    try:
        for setup in args.setups.split(","):
            for compiler in args.compilers.split(","):
                row = _measure(setup, compiler, args, device)
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(_table(rows), flush=True)
        if args.out:
            meta = {"args": vars(args), "world": world, "torch": torch.__version__}
            if device.type == "cuda":
                meta["gpu"] = torch.cuda.get_device_name(device)
            _write(rows, meta, Path(args.out))


def _spawned(rank: int, world: int, args: argparse.Namespace) -> None:
    run(rank, world, args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="a small model (checks the script)")
    p.add_argument("--nproc", type=int, default=2, help="ranks to spawn without torchrun")
    p.add_argument("--setups", default="ddp,fsdp2", help="of ddp, fsdp2, fsdp2_whole")
    p.add_argument("--compilers", default="eager,torch_compile,kiln")
    p.add_argument("--fsdp-compile", choices=["block", "whole"], default="block")
    p.add_argument(
        "--bucket-cap-mb",
        type=float,
        default=None,
        help="DDP's (default 25; torch.compile refuses < 1)",
    )
    p.add_argument("--batch", type=int, default=8, help="sequences per rank")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3, help="steps before timing (compiles)")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument(
        "--segments",
        type=int,
        default=1,
        help="the timed steps split into segments, each ended by a sync; the median one counts",
    )
    p.add_argument("--profile-steps", type=int, default=3, help="profiled steps (0: none)")
    p.add_argument("--out", default=None, help="folder for results.json and summary.md")
    p.add_argument("--merge", nargs="+", metavar="DIR", help="merge these runs' rows into --out")
    args = p.parse_args()
    if args.merge:
        merge(args.merge, args.out or "distributed-merged")
        return
    if args.device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // args.nproc))
    if "RANK" in os.environ:  # under torchrun
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    mp.spawn(_spawned, args=(args.nproc, args), nprocs=args.nproc)


if __name__ == "__main__":
    main()
