"""Host time per compiled call of a small transformer block: eager, torch.compile and Kiln.

At tiny sizes (width 64, 8 tokens, batch 2, one thread) the kernels cost next to nothing, so
a call's time is the host's: for Kiln the cache lookup and guard check, autograd_aot's runtime
(the ``autograd.Function`` node in training) and the generated wrapper; for torch.compile
Dynamo's guards, AOTAutograd's runtime and Inductor's wrapper. This is what bounds a step
whose blocks are compiled one by one under FSDP2 (docs/performance.md, "Data-parallel
training"). Per mode, the columns are timed interleaved in one process
(``measure.interleaved_medians``):

- ``infer``: the block's forward under ``no_grad``;
- ``train``: forward, then backward of the output's sum, then ``zero_grad(set_to_none=True)``
  as an optimizer step would (each gradient is then the backward's own tensor, not added in).

``--fsdp`` also times each column with the block under ``fully_shard`` on a 1-rank gloo
process group (each compiled as ``benchmarks/distributed.py`` compiles FSDP2's blocks): every
call then swaps the block's parameters in and out, and the backward reduce-scatters (a copy on
one rank); with ``--bf16`` its ``MixedPrecisionPolicy`` gathers bfloat16 parameters, as
``benchmarks/distributed.py`` runs FSDP2 on GPUs. Each column has its own block with the same
initial weights.

Run: ``python -m benchmarks.host_overhead [--fsdp] [--profile kiln/train]`` from the repository
root (every kiln package importable). ``--profile COLUMN/MODE`` prints a cProfile of that
column's calls instead. ``--device cuda`` runs the block on the GPU (FSDP2 on a 1-rank NCCL
group) and times wall time per call with the GPU synchronized after each round of calls: the
kernels are as small, so the time is still the host's, now with CUDA's launches and
allocator in it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from benchmarks.distributed import Block
from benchmarks.measure import interleaved_medians

COLUMNS = ("eager", "torch.compile", "kiln")
MODES = ("infer", "train")
DIM, HEADS, BATCH, SEQ = 64, 2, 2, 8


def _compile(column: str, block: torch.nn.Module) -> Callable[..., Any]:
    if column == "eager":
        return block
    if column == "torch.compile":
        return torch.compile(block)  # type: ignore[no-any-return]
    import kiln

    return kiln.compile(block, options={"graph_cache": False})  # type: ignore[no-any-return]


@contextlib.contextmanager
def _one_rank_group(device: str) -> Iterator[None]:
    """A process group of this process alone (FSDP2 needs one): gloo, NCCL on the GPU."""
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    with tempfile.NamedTemporaryFile() as f:
        dist.init_process_group(backend, init_method=f"file://{f.name}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _sharded(block: torch.nn.Module, bf16: bool) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = torch.bfloat16 if bf16 else None
    fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=dtype))
    return block


def _steps(
    fsdp: bool, x: torch.Tensor, columns: list[str], bf16: bool = False
) -> dict[str, dict[str, Callable[[], Any]]]:
    """Per mode, one step per column, each on its own copy of one block (checked to agree)."""
    torch.manual_seed(0)
    template = Block(DIM, HEADS).to(x.device)
    calls, blocks = {}, {}
    for column in ["eager", *columns]:
        block = blocks[column] = copy.deepcopy(template)
        calls[column] = _compile(column, _sharded(block, bf16) if fsdp else block)

    def infer(fn: Callable[..., Any]) -> Callable[[], Any]:
        def step() -> Any:
            with torch.no_grad():
                return fn(x)

        return step

    def train(fn: Callable[..., Any], block: torch.nn.Module) -> Callable[[], Any]:
        def step() -> Any:
            out = fn(x)
            out.sum().backward()
            block.zero_grad(set_to_none=True)
            return out

        return step

    steps = {
        "infer": {c: infer(fn) for c, fn in calls.items()},
        "train": {c: train(fn, blocks[c]) for c, fn in calls.items()},
    }
    for mode in MODES:  # compile, then check every column against eager's output
        expected = steps[mode]["eager"]().detach()
        for column in columns:
            for _ in range(2):
                got = steps[mode][column]().detach()
            tol = 3e-2 if bf16 else 1e-4
            torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    return steps


def _profile(step: Callable[[], Any], calls: int) -> None:
    import cProfile
    import pstats

    for _ in range(50):
        step()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        step()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(40)


def measure(fsdp: bool, args: argparse.Namespace) -> None:
    x = torch.randn(BATCH, SEQ, DIM, device=args.device)
    compiled = [c for c in COLUMNS[1:] if c in args.columns.split(",")]
    steps = _steps(fsdp, x, compiled, fsdp and args.bf16)
    if args.profile:
        column, _, mode = args.profile.partition("/")
        _profile(steps[mode][column], args.profile_calls)
        return
    setup = ("FSDP2 bf16 (1 rank)" if args.bf16 else "FSDP2 (1 rank, gloo)") if fsdp else "plain"
    for mode in MODES:
        clock = time.process_time if args.device == "cpu" else time.perf_counter
        medians = interleaved_medians(
            steps[mode], args.device, args.rounds, args.budget, clock=clock
        )
        us = {c: s * 1e6 for c, s in medians.items()}
        cells = "".join(f"{us[c]:>15.1f}" if c in us else f"{'':>15}" for c in COLUMNS)
        both = "kiln" in us and "torch.compile" in us
        ratio = f"{us['kiln'] / us['torch.compile']:>20.2f}" if both else ""
        print(f"{setup:<22}{mode:<7}{cells}{ratio}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsdp", action="store_true", help="also under fully_shard (1 rank)")
    parser.add_argument("--fsdp-only", action="store_true", help="only under fully_shard")
    parser.add_argument(
        "--bf16", action="store_true", help="FSDP2 with bfloat16 parameters (MixedPrecisionPolicy)"
    )
    parser.add_argument("--columns", default="torch.compile,kiln", help="besides eager")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--budget", type=float, default=4.0, help="seconds per column at most")
    parser.add_argument("--profile", default=None, help="COLUMN/MODE: cProfile its calls")
    parser.add_argument("--profile-calls", type=int, default=2000)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    what = "process CPU time" if args.device == "cpu" else "wall time (GPU synchronized)"
    print(
        f"torch {torch.__version__}; microseconds of {what} per call, medians of interleaved rounds"
    )
    header = "".join(f"{c:>15}" for c in COLUMNS)
    print(f"{'setup':<22}{'mode':<7}{header}{'kiln/torch.compile':>20}")
    if not args.fsdp_only:
        measure(False, args)
    if args.fsdp or args.fsdp_only:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        with _one_rank_group(args.device):
            measure(True, args)


if __name__ == "__main__":
    main()
