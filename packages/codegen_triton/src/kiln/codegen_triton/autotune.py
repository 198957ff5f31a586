"""Block sizes and ``num_warps``: heuristics from size hints, then a short benchmark.

Each kernel gets a small candidate set built from its sizes (``max_autotune``
widens it). On the first launch with a GPU every candidate is timed on copies of
the buffers the kernel writes (so accumulating kernels do not corrupt their
outputs) and the winner is cached on disk, keyed by the kernel source and the
GPU model, so the next process skips the benchmark. Without a GPU (the
interpreter) the heuristic pick, the first candidate, is used.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import triton

from kiln.capture import counters
from kiln.codegen_triton.kernel import KernelSource
from kiln.codegen_triton.tiling import MAX_GRID_Y
from kiln.codegen_triton.timing import bench_ms
from kiln.loopir import serialize
from kiln.loopir.disk_cache import atomic_write, private_dir
from kiln.loopir.wrapper import clone_strided

__all__ = ["Config", "candidate_configs", "Autotuner", "next_power_of_2", "used_records"]

log = logging.getLogger("kiln.codegen_triton.autotune")

_ELEMENTS_PER_PROGRAM = 4096  # a [XBLOCK, RBLOCK] tile larger than this spills registers

_used: dict[Path, None] = {}
"""The records this process read or wrote, in order (what a saved cache file carries)."""


def used_records() -> list[Path]:
    """The autotuning records this process read or wrote."""
    return list(_used)


@dataclasses.dataclass(frozen=True)
class Config:
    """Launch parameters of one candidate."""

    XBLOCK: int
    RBLOCK: int = 1
    num_warps: int = 4
    YBLOCK: int = 1

    __reduce__ = serialize.by_fields

    def constexprs(self, kind: str) -> dict[str, int]:
        """Block sizes a kernel of ``kind`` (``KernelSource.kind``) takes."""
        if kind == "reduction":
            return {"XBLOCK": self.XBLOCK, "RBLOCK": self.RBLOCK}
        if kind == "tiled":
            return {"XBLOCK": self.XBLOCK, "YBLOCK": self.YBLOCK}
        return {"XBLOCK": self.XBLOCK}

    def grid(self, ks: KernelSource) -> tuple[int, ...]:
        """Programs to launch: one per block of x (and of y for a tiled kernel)."""
        if ks.kind == "tiled":
            inner, outer = ks.sizes
            return (-(-inner // self.XBLOCK), -(-outer // self.YBLOCK))
        return (-(-ks.numel // self.XBLOCK),)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _warps(elements: int) -> int:
    return max(1, min(8, elements // 256))


def _pointwise(numel: int, wide: bool) -> list[Config]:
    cap = next_power_of_2(numel)
    blocks = [64, 128, 256, 512, 1024, 2048] if wide else [1024, 256]
    first = min(1024, cap)
    sizes = [first] + [b for b in blocks if b <= max(cap, 64) and b != first]
    warps = (2, 4, 8) if wide else (None,)
    return [Config(x, 1, w or _warps(x)) for x in sizes for w in warps]


def _persistent(numel: int, rnumel: int, wide: bool) -> list[Config]:
    rblock = next_power_of_2(rnumel)
    xcap = next_power_of_2(numel)
    most = max(1, min(xcap, _ELEMENTS_PER_PROGRAM // rblock))
    xblocks = [most] + [x for x in ((1, 8, 32, 64) if wide else (1, 8)) if x < most]
    warps = (2, 4, 8) if wide else (None,)
    return [Config(x, rblock, w or _warps(x * rblock)) for x in xblocks for w in warps]


def _tiled(inner: int, outer: int, wide: bool) -> list[Config]:
    pairs = [(32, 32), (64, 64), (16, 64), (64, 16)] if wide else [(32, 32), (64, 64)]
    seen: list[Config] = []
    for px, py in pairs:
        x, y = min(px, next_power_of_2(inner)), min(py, next_power_of_2(outer))
        cfg = Config(x, 1, _warps(x * y), y)
        if cfg not in seen and -(-outer // y) <= MAX_GRID_Y:
            seen.append(cfg)
    return seen or [Config(min(32, next_power_of_2(inner)), 1, 4, 1024)]


def _looped(numel: int, rnumel: int, wide: bool) -> list[Config]:
    rcap = next_power_of_2(rnumel)
    pairs = [(1, 2048), (8, 512), (1, 512)] + ([(4, 1024), (16, 256), (64, 64)] if wide else [])
    seen: list[Config] = []
    for x, r in pairs:
        cfg = Config(min(x, next_power_of_2(numel)), min(r, rcap), _warps(x * r))
        if cfg not in seen:
            seen.append(cfg)
    return seen


def _outer(numel: int, rnumel: int, wide: bool) -> list[Config]:
    """Wide, short tiles first: each row of a load reads ``XBLOCK`` neighbours at once."""
    xcap, rcap = next_power_of_2(numel), next_power_of_2(rnumel)
    pairs = [(64, 16), (32, 32), (16, 64), (8, 128), (8, 512)]
    pairs += [(128, 8), (4, 256)] if wide else []
    seen: list[Config] = []
    for x, r in pairs:
        cfg = Config(min(x, xcap), min(r, rcap), 4 if x * r <= 1024 else 8)
        if cfg not in seen:
            seen.append(cfg)
    return seen


def candidate_configs(
    ks: KernelSource, *, max_autotune: bool = False, rblock: int | None = None
) -> list[Config]:
    """Candidates for a kernel, heuristic favourite first."""
    if ks.kind == "tiled":
        return _tiled(ks.sizes[0], ks.sizes[1], max_autotune)
    if not ks.reduction:
        return _pointwise(ks.numel, max_autotune)
    if ks.persistent:
        return _persistent(ks.numel, ks.rnumel, max_autotune)
    configs = (_outer if ks.outer else _looped)(ks.numel, ks.rnumel, max_autotune)
    if rblock is not None:
        configs = [dataclasses.replace(c, RBLOCK=rblock) for c in configs]
    return configs


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu-interpreter"


class Autotuner:
    """Picks one :class:`Config` per kernel, benchmarking on first use when on a GPU."""

    def __init__(
        self,
        source: str,
        configs: Sequence[Config],
        cache_dir: Path,
        written: Sequence[int],
    ) -> None:
        self.configs = list(configs)
        self.written = tuple(written)
        self.cache_dir = cache_dir
        ident = f"{source}\n{device_name()}\n{triton.__version__}"
        self.key = hashlib.sha256(ident.encode()).hexdigest()
        self.best: Config | None = self.configs[0] if len(self.configs) == 1 else None

    def _cache_file(self) -> Path:
        return private_dir(self.cache_dir, "autotune") / f"{self.key[:32]}.json"

    def load_cached(self) -> Config | None:
        """The recorded winner, if the record is readable and names one of ``configs``."""
        record = self._cache_file()
        try:
            cfg = Config(**json.loads(record.read_text()))
        except (OSError, ValueError, TypeError):  # missing, damaged, or another shape of record
            return None
        if cfg not in self.configs:
            return None
        _used[record] = None
        return cfg

    def _save(self, cfg: Config) -> None:
        record = self._cache_file()
        atomic_write(record, json.dumps(dataclasses.asdict(cfg)))
        _used[record] = None

    def choose(self, run: Callable[[Config, Sequence[Any]], None], args: Sequence[Any]) -> Config:
        """The config to launch with; ``run(config, args)`` launches one candidate."""
        if self.best is not None:
            return self.best
        on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        cached = self.load_cached() if on_gpu else None
        if not on_gpu:
            self.best = self.configs[0]
        elif cached is not None:
            self.best = cached
        else:
            with counters.phase("triton.autotune"):  # less the compiles it waits for
                self.best = self._benchmark(run, args)
            self._save(self.best)
        return self.best

    def _benchmark(
        self, run: Callable[[Config, Sequence[Any]], None], args: Sequence[Any]
    ) -> Config:
        scratch = list(args)
        for i in self.written:
            scratch[i] = clone_strided(args[i])
        timings = {}
        for cfg in self.configs:
            try:
                timings[cfg] = bench_ms(functools.partial(run, cfg, scratch))
            except Exception as exc:  # a config that fails to compile just loses
                log.info("config %s failed: %s", cfg, exc)
        if not timings:
            return self.configs[0]
        best = min(timings, key=lambda c: timings[c])
        log.info("autotuned %s: %s", best, {str(c): round(t, 4) for c, t in timings.items()})
        return best
