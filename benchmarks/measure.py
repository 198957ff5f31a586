"""Measuring steps: median times, peak memory, and closeness to eager.

Backends are timed interleaved, each called once per round: load on a shared machine drifts
over seconds, and backends timed one after another each saw their own stretch of it, so their
ratios swung by up to 30% between runs. Interleaved, they share the drift.

Closeness is the relative error ``|a - b| / |b|`` in the 2-norm per output tensor: robust for
large models where elementwise tolerances trip on a few tiny entries, and readable across dtypes.
A tensor far smaller than the largest one (a gradient that is zero in exact arithmetic, like a
key bias under softmax) is measured against 1% of the largest norm instead, an absolute floor.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = [
    "TOLERANCES",
    "MemoryMeter",
    "flat_tensors",
    "interleaved_medians",
    "relative_error",
    "timed_call",
]

# Largest relative error (2-norm) accepted against eager, per --dtype.
TOLERANCES = {"float32": 1e-3, "amp": 3e-2, "bfloat16": 1e-2}
# Norms below this fraction of the largest expected tensor's norm are compared against it.
_FLOOR = 1e-2
# A timed call lasts at least this long: shorter steps are repeated (at most _MAX_REPEAT times).
MIN_CALL_S = 5e-3
_MAX_REPEAT = 50


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nested output (tuples, dicts, HF ModelOutput), in a fixed order."""
    leaves = pytree.tree_leaves(value)
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if not tensors:
        for leaf in leaves:
            tensors += [v for v in vars(leaf).values() if isinstance(v, torch.Tensor)]
    return [t.detach() for t in tensors]


def relative_error(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    """The worst relative error over paired tensors; inf when structure, shape or dtype differ."""
    if len(actual) != len(expected):
        return float("inf")
    norms = [float(e.double().nan_to_num().norm()) for e in expected if e.is_floating_point()]
    floor = max([1e-12, *(_FLOOR * n for n in norms)])
    worst = 0.0
    for a, e in zip(actual, expected, strict=True):
        if a.shape != e.shape or a.dtype != e.dtype:
            return float("inf")
        if not e.is_floating_point():
            worst = max(worst, 0.0 if torch.equal(a, e) else float("inf"))
            continue
        a64, e64 = a.double(), e.double()
        if not torch.equal(a64.isnan(), e64.isnan()):
            return float("inf")
        a64, e64 = a64.nan_to_num(), e64.nan_to_num()
        scale = max(float(e64.norm()), floor)
        worst = max(worst, float((a64 - e64).norm()) / scale)
    return worst


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_call(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    """Run ``fn`` once and return its result and wall time in seconds (device work included)."""
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - start


def _step_s(
    fn: Callable[[], Any], device: str, clock: Callable[[], float] = time.perf_counter
) -> float:
    """One call's time in seconds: CUDA events on GPU, ``clock`` (wall time) on CPU."""
    if device != "cuda":
        start = clock()
        fn()
        return clock() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _repeated(fn: Callable[[], Any], n: int) -> Callable[[], Any]:
    if n == 1:
        return fn

    def calls() -> None:
        for _ in range(n):
            fn()

    return calls


def interleaved_medians(
    steps: dict[str, Callable[[], Any]],
    device: str,
    iters: int,
    budget_s: float,
    min_call_s: float = MIN_CALL_S,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds per step, timed in rounds that call every step once (see above).

    Round ``r`` starts at step ``r mod n``, so no step always runs right after the same one (and
    inherits its caches). Stops after ``iters`` rounds, or after 3 once ``budget_s`` per step is
    spent. A step shorter than ``min_call_s`` is timed as the mean of back-to-back calls, the
    same number for every step (as a model runs in a loop): single calls of a sub-millisecond
    step, each after another backend's, mostly measured cold caches and timer noise. On the
    CPU, ``clock`` may be ``time.process_time``: the process's CPU time, which other
    processes' load on a shared machine inflates far less than wall time (host-bound steps).
    """
    names = list(steps)
    if not names:
        return {}
    fastest = min(_step_s(steps[name], device, clock) for name in names)
    repeat = max(1, min(_MAX_REPEAT, math.ceil(min_call_s / max(fastest, 1e-9))))
    times: dict[str, list[float]] = {name: [] for name in names}
    began = time.perf_counter()
    for r in range(iters):
        first = r % len(names)
        for name in names[first:] + names[:first]:
            step_s = _step_s(_repeated(steps[name], repeat), device, clock)
            times[name].append(step_s / repeat)
        if r >= 2 and time.perf_counter() - began > budget_s * len(names):
            break
    return {name: statistics.median(t) for name, t in times.items()}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemoryMeter:
    """Peak memory above the starting point while active, in MiB.

    CUDA: the allocator's peak. CPU: resident set size sampled every few milliseconds by a
    background thread (the process-wide high-water mark would include earlier backends).
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.peak_mb = 0.0

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            try:
                yield
            finally:
                torch.cuda.synchronize()
                self.peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
            return
        base = _rss_bytes()
        peak = [base]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.005):
                peak[0] = max(peak[0], _rss_bytes())

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            peak[0] = max(peak[0], _rss_bytes())
            self.peak_mb = (peak[0] - base) / 2**20
