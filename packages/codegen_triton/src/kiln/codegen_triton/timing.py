"""Timing candidate kernels on the GPU, with the L2 cache flushed between runs.

Triton's ``do_bench`` flushes the cache by zeroing a fixed 256 MB buffer it allocates on
every call, which raised the peak memory of a first call (when autotuning runs) by 256 MB
over what the model needs. Zeroing a buffer as large as the L2 cache flushes it as well.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["bench_ms"]

_FALLBACK_L2_BYTES = 64 << 20  # above any current GPU's L2 where torch does not report it


def _flush_buffer() -> torch.Tensor:
    """A fresh L2-sized buffer (the caching allocator hands the same block back next time;
    none is held between calls)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    size = int(getattr(props, "L2_cache_size", 0) or _FALLBACK_L2_BYTES)
    return torch.empty(size // 4, dtype=torch.int32, device="cuda")


def bench_ms(fn: Callable[[], Any], warmup: int = 5, rep_ms: float = 20.0) -> float:
    """Median milliseconds of ``fn`` on the current CUDA device, each run after a cold L2.

    Runs it ``warmup`` times, estimates one run's time, then times as many runs as fit in
    ``rep_ms`` (between 5 and 100), each on its own pair of events.
    """
    flush = _flush_buffer()
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    end.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    runs = max(5, min(100, int(rep_ms / estimate)))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(runs)
    ]
    for begin, finish in events:
        flush.zero_()
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(finish) for begin, finish in events)
