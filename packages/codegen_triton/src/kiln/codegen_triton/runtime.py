"""Loading and launching generated kernels.

Kernel modules are written once to the on-disk cache (``<cache>/kernels/<hash>.py``)
and imported from there, so Triton can read their source and its own cache of
compiled binaries is reused across processes; ``<cache>/index.json`` records
which Kiln kernel each file holds. On a GPU, kernels of one graph are compiled
in parallel worker processes as soon as they are generated: each worker imports
the module and warms Triton's cache for every candidate config, and the first
launch in this process then only loads binaries.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import json
import logging
import multiprocessing
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import triton

from kiln.codegen_triton.autotune import Autotuner, Config
from kiln.codegen_triton.errors import TritonLaunchError
from kiln.codegen_triton.kernel import KernelSource

__all__ = ["MODULE_HEADER", "load_module", "TritonLauncher", "compile_pool"]

log = logging.getLogger(__name__)

MODULE_HEADER = """\
import triton
import triton.language as tl

from kiln.codegen_triton import helpers as kh
from kiln.codegen_triton.mathlib import libdevice

"""

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def module_path(cache_dir: Path, text: str) -> Path:
    return cache_dir / "kernels" / f"k{source_hash(text)}.py"


def write_module(cache_dir: Path, text: str, kernel_name: str) -> Path:
    """The module file holding ``text`` (written atomically if new) and its index entry."""
    path = module_path(cache_dir, text)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        _index_add(cache_dir, path.stem, kernel_name)
    return path


def _index_add(cache_dir: Path, stem: str, kernel_name: str) -> None:
    index = cache_dir / "index.json"
    with _lock:
        try:
            data = json.loads(index.read_text())
        except (OSError, ValueError):
            data = {}
        data[stem] = {"kernel": kernel_name, "triton": triton.__version__}
        tmp = index.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(index)


def load_module(path: Path) -> ModuleType:
    """Import a kernel module file once per process."""
    key = str(path)
    with _lock:
        if key in _modules:
            return _modules[key]
        spec = importlib.util.spec_from_file_location(f"kiln_triton_{path.stem}", path)
        if spec is None or spec.loader is None:
            msg = f"cannot import generated kernel module {path}"
            raise TritonLaunchError(msg)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _modules[key] = module
        return module


_pool: concurrent.futures.ProcessPoolExecutor | None = None


def compile_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """Worker processes (spawned: CUDA does not survive fork) that warm Triton's cache."""
    global _pool  # one pool per process
    with _lock:
        if _pool is None:
            ctx = multiprocessing.get_context("spawn")
            _pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx)
        return _pool


def warm_in_worker(
    path: str, name: str, dtypes: Sequence[str], scalars: Sequence[int],
    configs: Sequence[tuple[dict[str, int], int]],
) -> None:  # fmt: skip
    """Compile ``name`` for every config (runs in a worker; no launch happens)."""
    fn = getattr(load_module(Path(path)), name)
    tensors = [torch.empty(16, dtype=getattr(torch, d), device="cuda") for d in dtypes]
    for constexprs, warps in configs:
        fn.warmup(*tensors, *scalars, grid=(1,), num_warps=warps, **constexprs)


class TritonLauncher:
    """The callable loopir's wrapper calls: ``launcher(*tensors)`` with ``group.args`` order."""

    def __init__(
        self,
        ks: KernelSource,
        path: Path,
        arg_names: Sequence[str],
        written: Sequence[str],
        configs: Sequence[Config],
        cache_dir: Path,
    ) -> None:
        self.ks = ks
        self.path = path
        unique = list(dict.fromkeys(arg_names))
        self.positions = [list(arg_names).index(n) for n in unique]
        self.scalars = ks.sizes
        written_pos = [i for i, n in enumerate(unique) if n in set(written)]
        self.tuner = Autotuner(ks.source, configs, cache_dir, written_pos)
        self.fn: Any = None
        self.warming: concurrent.futures.Future[None] | None = None

    def start_parallel_compile(self, dtypes: Sequence[torch.dtype], workers: int) -> None:
        """Begin compiling every candidate in a worker process (GPU only)."""
        names = [str(d).removeprefix("torch.") for d in dtypes]
        configs = [(c.constexprs(self.ks.kind), c.num_warps) for c in self.tuner.configs]
        self.warming = compile_pool(workers).submit(
            warm_in_worker, str(self.path), self.ks.name, names, self.scalars, configs
        )

    def _kernel(self) -> Any:
        if self.fn is None:
            if self.warming is not None:
                try:
                    self.warming.result()
                except Exception as exc:  # compile again here; errors surface from here
                    log.info(
                        "parallel compile of %s failed (%s); compiling inline", self.ks.name, exc
                    )
                self.warming = None
            self.fn = getattr(load_module(self.path), self.ks.name)
        return self.fn

    def run(self, cfg: Config, tensors: Sequence[Any]) -> None:
        self._kernel()[cfg.grid(self.ks)](
            *tensors, *self.scalars, num_warps=cfg.num_warps, **cfg.constexprs(self.ks.kind)
        )

    def __call__(self, *args: torch.Tensor) -> None:
        if self.ks.numel == 0:
            return
        tensors = [args[i] for i in self.positions]
        cfg = self.tuner.choose(self.run, tensors)
        self.run(cfg, tensors)
