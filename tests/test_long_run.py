"""A long training run in one process: memory and step time stay flat.

A server or a training job calls compiled code millions of times. Every call that leaves
something behind (a cache entry, a saved tensor, a record in a counter, a node in an autograd
graph) shows here as resident memory that grows with the step count, and every per-call cost
that grows (a list scanned on each call, a guard check that lengthens) as a step time that
creeps up. The run cycles through a few batch sizes, so it also exercises the cache lookup
over several entries, and trains an eager twin on the same inputs to check the answers.

Resident memory catches leaks of buffers (a page a step); the count of objects the garbage
collector tracks catches small ones (a list, a closure or an instance a step) that stay in
pages already resident. Each compiled step is timed against the eager twin's step right after
it, so a busy machine slows both and their ratio stays put, while a cost that grows with the
call count in Kiln's call path raises it.
"""

from __future__ import annotations

import copy
import gc
import os
import statistics
import time

import pytest
import torch

import kiln

STEPS = 2000
WARMUP = 500
BATCHES = (3, 5, 8, 13)
# A leak of a single 4 KiB page every step would add STEPS * 4 KiB = 8 MiB by the end; half of
# that over the measured steps fails the test, while allocator noise stays well under it.
RSS_BOUND = (STEPS - WARMUP) * 4096 // 2
# Python objects made per step and kept: one per step would be 1,500.
OBJECTS_BOUND = 200
# The compiled step's time over the eager step's: a median of 200 ratios moves by a few per
# cent between windows on an idle machine, and by up to about 1.6x when the other test worker's
# load changes between the two windows; a cost that grows with every step passes 2x well before
# the end of the run.
TIME_FACTOR = 2.0


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _sync(device: str) -> None:
    """Wait for the device's queue, so a step's time and memory are the step's own."""
    if device == "cuda":
        torch.cuda.synchronize()


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = (model(x) - x.sum(dim=1, keepdim=True)).square().mean()
    loss.backward()
    opt.step()
    return loss.detach()


CUDA = pytest.param(
    "cuda",
    marks=pytest.mark.gpu,
)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_two_thousand_training_steps_keep_memory_and_step_time_flat(device, resident_bytes):
    torch.manual_seed(0)
    twin = _model().to(device)
    model = copy.deepcopy(twin)
    compiled = kiln.compile(model, dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    rss: list[int] = []
    allocated: list[int] = []  # the device's tensors (CUDA)
    ratios: list[float] = []
    objects = 0
    for i in range(STEPS):
        if i == WARMUP:
            gc.collect()
            objects = len(gc.get_objects())
        x = torch.randn(BATCHES[i % len(BATCHES)], 8, device=device)
        start = time.perf_counter()
        loss = _step(compiled, opt, x)
        _sync(device)
        middle = time.perf_counter()
        want = _step(twin, twin_opt, x)
        _sync(device)
        ratios.append((middle - start) / (time.perf_counter() - middle))
        if i % 100 == 0 or i == STEPS - 1:
            torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
            for p, q in zip(model.parameters(), twin.parameters(), strict=True):
                torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        rss.append(resident_bytes(trim=False))  # steps are timed: no trim between them
        if device == "cuda":
            allocated.append(torch.cuda.memory_allocated())
    s = kiln.stats()
    assert s.eager_fallbacks == 0 and s.graph_breaks == 0, s
    assert s.frames_captured == len(BATCHES), s
    assert s.recompiles == len(BATCHES) - 1, s
    growth = rss[-1] - rss[WARMUP]
    assert growth < RSS_BOUND, f"RSS grew {growth / 2**20:.1f} MiB over {STEPS - WARMUP} steps"
    if allocated:  # a cycle of batch sizes holds the same tensors each time round
        cycle = len(BATCHES)
        assert max(allocated[-cycle:]) <= max(allocated[WARMUP : WARMUP + cycle])
    gc.collect()
    kept = len(gc.get_objects()) - objects
    assert kept < OBJECTS_BOUND, f"{kept} more objects after {STEPS - WARMUP} steps"
    early = statistics.median(ratios[WARMUP : WARMUP + 200])
    late = statistics.median(ratios[-200:])
    assert late < TIME_FACTOR * early, f"compiled/eager step time {early:.2f} -> {late:.2f}"
