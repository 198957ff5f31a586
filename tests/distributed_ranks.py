"""Two ranks (gloo on CPU) training a small transformer compiled by Kiln against eager.

``python tests/distributed_ranks.py ddp|fsdp2 STORE`` spawns two processes
(``torch.multiprocessing``) that train each scenario of the group for five steps on their
own batches and check losses and parameters against the same eager distributed run, and the
graph pieces DDP's buckets split the graph into; the DDP group also checks a traced
``dist.all_reduce`` across the ranks, the FSDP2 group a ``torch.distributed.checkpoint``
round trip from the compiled model. ``tests/test_distributed_ranks.py`` runs it
(one spawned run per group); the GPU benchmark ``benchmarks/distributed.py`` trains the same
block at GPT-2-medium size.
"""

from __future__ import annotations

import sys
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's benchmarks
from benchmarks.distributed import Block  # noqa: E402  the benchmark's block, at a tiny size

STEPS = 5
VOCAB, SEQ, BATCH = 64, 12, 4


class TinyGPT(nn.Module):
    def __init__(
        self, vocab: int = VOCAB, dim: int = 32, heads: int = 2, layers: int = 2, seq: int = SEQ
    ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)
        self.unused: nn.Linear | None = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def loss_of(model: Callable[..., torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def batches(rank: int) -> Iterator[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own: the all-reduce matters
    while True:
        yield torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)


def _plain(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def train_against_eager(
    compiled: Callable[..., torch.Tensor],
    ref: Callable[..., torch.Tensor],
    params: tuple[list[nn.Parameter], list[nn.Parameter]],
    rank: int,
    tol: dict[str, float],
    accumulate: tuple[Any, Any] | None = None,
) -> None:
    """STEPS steps of SGD on both (Adam would turn rounding in near-zero gradients into
    whole steps); losses each step and parameters at the end equal.
    ``accumulate``: the two DDP modules, each step two micro-batches (the first under
    ``no_sync``)."""
    opts = [torch.optim.SGD(p, lr=0.5) for p in params]
    data = batches(rank)
    for step in range(STEPS):
        idx = next(data)
        if accumulate is not None:
            first = next(data)
            for fn, wrapper in zip((compiled, ref), accumulate, strict=True):
                with wrapper.no_sync():
                    loss_of(fn, first).backward()
        losses = [loss_of(fn, idx) for fn in (compiled, ref)]
        for loss in losses:
            loss.backward()
        torch.testing.assert_close(losses[0], losses[1], **tol, msg=f"loss, step {step}")
        for opt in opts:
            opt.step()
            opt.zero_grad()
    for i, (p, q) in enumerate(zip(*params, strict=True)):
        torch.testing.assert_close(_plain(p), _plain(q), **tol, msg=f"parameter {i}")


def _model(unused: bool = False) -> TinyGPT:
    torch.manual_seed(0)
    model = TinyGPT()
    if unused:
        model.unused = nn.Linear(4, 4)  # never called: find_unused_parameters marks it ready
    return model


# DDP: (how it is compiled, DDP's options, backend, the pieces expected)
TINY = 1e-6  # a one-byte bucket: every parameter its own (torch 2.11 refuses 0)
# Under a one-byte bucket each parameter closes a piece at its first use, so the pieces are
# the graph's parameter-using ops: per block ln1, qkv, proj, ln2, fc, out (6 x 2 blocks),
# ln and head, the position embedding (with the arange and the add) and the token one.
TINY_PIECES = 16
# 47 kB, about a block's parameters (50.8 kB): counted back from the output, the first
# bucket fills at block 1's qkv (head, ln and block 1 down to it), the second at block 0's
# qkv (block 1's ln1 and block 0 down to it), the rest (block 0's ln1, the embeddings) is
# the third.
MID_MB = 0.045
MID_PIECES = 3
DDP_SCENARIOS: list[tuple[str, dict[str, Any], str, int]] = [
    ("compile(DDP)", {"bucket_cap_mb": MID_MB}, "kiln", MID_PIECES),
    ("DDP(compile)", {"bucket_cap_mb": TINY}, "aot_eager", TINY_PIECES),
    ("compile(DDP)", {"bucket_cap_mb": 1000}, "aot_eager", 1),
    ("compile(DDP)", {"bucket_cap_mb": MID_MB, "find_unused_parameters": True}, "aot_eager", 3),
    ("DDP(compile)", {"bucket_cap_mb": MID_MB, "static_graph": True}, "aot_eager", MID_PIECES),
    ("no_sync", {"bucket_cap_mb": MID_MB}, "aot_eager", MID_PIECES),
]


def ddp_worker(rank: int) -> None:
    import kiln

    for how, options, backend, pieces in DDP_SCENARIOS:
        kiln.reset()
        start = time.perf_counter()
        unused = bool(options.get("find_unused_parameters"))
        model, ref_model = _model(unused), _model(unused)
        ref = DDP(ref_model, **options)
        if how == "DDP(compile)":
            wrapper = DDP(kiln.compile(model, backend=backend), **options)
            compiled: Callable[..., torch.Tensor] = wrapper
        else:
            wrapper = DDP(model, **options)
            compiled = kiln.compile(wrapper, backend=backend)
        train_against_eager(
            compiled,
            ref,
            (list(model.parameters()), list(ref_model.parameters())),
            rank,
            {"rtol": 1e-4, "atol": 1e-5},
            accumulate=(wrapper, ref) if how == "no_sync" else None,
        )
        s = kiln.stats()
        label = f"{how} {options} {backend}"
        if rank == 0:
            print(label, s.ddp_graph_pieces, time.perf_counter() - start, flush=True)
        assert (s.graphs_compiled, s.eager_fallbacks, s.graph_breaks) == (1, 0, 0), (label, s)
        assert s.ddp_graph_pieces == pieces, (label, s.ddp_graph_pieces)


def collective_worker(rank: int) -> None:
    """An in-place all_reduce traced as a functional collective reduces across the ranks."""
    import kiln

    def reduce(x: torch.Tensor) -> torch.Tensor:
        y = x * (dist.get_rank() + 1)
        dist.all_reduce(y)
        return y.sin()

    fn = kiln.compile(reduce, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        x = torch.full((5,), float(rank))
        torch.testing.assert_close(fn(x), reduce(x.clone()))
        torch.testing.assert_close(fn(x), torch.full((5,), 2.0).sin())  # 0 * 1 + 1 * 2


def checkpoint_round_trip(
    model: nn.Module, ref: nn.Module, compiled: Callable[..., torch.Tensor], folder: str, rank: int
) -> None:
    """``torch.distributed.checkpoint`` saves the compiled model's shards and loads them into
    the eager one, zeroed first: equal parameters, and an equal loss after."""
    import torch.distributed.checkpoint as dcp

    dcp.save(model.state_dict(), checkpoint_id=folder)
    with torch.no_grad():
        for q in ref.parameters():
            q.zero_()
    state = ref.state_dict()
    dcp.load(state, checkpoint_id=folder)
    ref.load_state_dict(state)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(_plain(p), _plain(q))
    idx = next(batches(rank + 7))
    tol = {"rtol": 2e-2, "atol": 2e-3}
    torch.testing.assert_close(loss_of(compiled, idx), loss_of(ref, idx), **tol)


def fsdp2_worker(rank: int, folder: str) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import kiln

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for per_block in (True, False):
        kiln.reset()
        start = time.perf_counter()
        model, ref = _model(), _model()
        for m in (model, ref):
            for block in m.blocks:
                fully_shard(block, mp_policy=policy)
            fully_shard(m, mp_policy=policy)
        if per_block:
            for i, block in enumerate(model.blocks):
                model.blocks[i] = kiln.compile(block, backend="aot_eager")
            compiled: Callable[..., torch.Tensor] = model
        else:
            compiled = kiln.compile(model, backend="aot_eager")
        seen: list[torch.dtype] = []
        block0 = getattr(model.blocks[0], "_orig_mod", model.blocks[0])  # after FSDP's hook:
        hook = block0.register_forward_pre_hook(
            lambda m, args: seen.append(next(m.parameters()).dtype)
        )
        train_against_eager(
            compiled,
            ref,
            (list(model.parameters()), list(ref.parameters())),
            rank,
            {"rtol": 2e-2, "atol": 2e-3},  # bfloat16 compute
        )
        hook.remove()
        assert seen == [torch.bfloat16] * STEPS, seen  # unsharded in bf16 before the block
        for p in model.parameters():  # resharded after: float32 DTensor shards again
            assert type(p).__name__ == "DTensor" and p.dtype == torch.float32
        s = kiln.stats()
        assert s.eager_fallbacks == 0, s
        # per block: Block.forward, one graph for each of the two block objects; whole: the
        # root's graph cut at each block call (embeddings before the first, ln and head after
        # the last, nothing between), each block's forward compiled under its FSDP hooks
        expected = 2 if per_block else 4
        assert s.graph_break_kinds == ({} if per_block else {"distributed_module": 2}), s
        assert s.graphs_compiled == expected, (per_block, s)
        checkpoint_round_trip(model, ref, compiled, f"{folder}-{per_block}", rank)
        if rank == 0:
            print("per block" if per_block else "whole", time.perf_counter() - start, flush=True)


def _worker(rank: int, group: str, store: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        if group == "ddp":
            ddp_worker(rank)
            collective_worker(rank)
        else:
            fsdp2_worker(rank, store + ".checkpoint")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    mp.spawn(_worker, args=(sys.argv[1], sys.argv[2]), nprocs=2)
    print(f"{sys.argv[1]}: two ranks ok")
