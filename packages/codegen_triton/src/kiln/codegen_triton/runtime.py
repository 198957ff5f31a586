"""Launching generated kernels: the callable loopir's wrapper calls.

A :class:`TritonLauncher` imports its kernel module from the on-disk cache
(``module_cache.py``), picks a config (``autotune.py``), computes the grid and
launches. On a GPU, kernels of one graph are compiled in parallel worker
processes as soon as they are generated (``compile_pool.py``): each worker warms
Triton's cache for every candidate config, and the first launch here then only
loads binaries.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from triton import knobs

from kiln.capture import counters
from kiln.codegen_triton import config
from kiln.codegen_triton.autotune import Autotuner, Config, device_name
from kiln.codegen_triton.compile_pool import compile_pool
from kiln.codegen_triton.kernel import KernelSource
from kiln.codegen_triton.mathlib import INTERPRET
from kiln.codegen_triton.module_cache import load_module, write_module

__all__ = ["TritonLauncher"]

log = logging.getLogger(__name__)


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
        self._made_of = (ks, tuple(arg_names), tuple(written), tuple(configs))
        unique = list(dict.fromkeys(arg_names))
        positions = [list(arg_names).index(n) for n in unique]
        self.positions = None if positions == list(range(len(arg_names))) else positions
        """Where each distinct argument is in a call's arguments; None: all of them, in order."""
        self.scalars = ks.sizes
        written_pos = [i for i, n in enumerate(unique) if n in set(written)]
        self.tuner = Autotuner(ks.source, configs, cache_dir, written_pos)
        self.fn: Any = None
        self.warming: list[concurrent.futures.Future[None]] = []
        self._binaries: dict[tuple[Any, ...], Any] = {}
        self._tuned: dict[tuple[bool, ...], Any] = {}
        """The tuned config's binaries by alignment of the pointers: the launch path."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Stored for a whole-graph cache as what it was made of, and the config it tuned
        (with the GPU it was tuned on): a loaded launcher writes its module again under this
        process's cache folder if missing, and its first launch loads the binary from Triton's
        cache (compiling it there, in this process, where that cache lacks it)."""
        return (_restored, (type(self), *self._made_of, self._options(), _tuned(self.tuner)))

    def _options(self) -> dict[str, Any]:
        """Keyword arguments of a subclass's constructor, for :meth:`__reduce__`."""
        return {}

    def start_parallel_compile(self, dtypes: Sequence[torch.dtype], workers: int) -> None:
        """Begin compiling every candidate config, one worker job each (GPU only)."""
        names = [str(d).removeprefix("torch.") for d in dtypes]
        base: dict[str, Any] = {"path": str(self.path), "name": self.ks.name, "dtypes": names}
        base["scalars"] = self.scalars
        try:
            pool = compile_pool(workers)
            self.warming = [  # the configs share a launcher: one job loads its kernel
                pool.submit(
                    base | {"configs": [(c.constexprs(self.ks.kind), c.num_warps)], "load": i == 0}
                )
                for i, c in enumerate(self.tuner.configs)
            ]
        except RuntimeError as exc:  # a broken pool: compile inline on first launch
            log.info("parallel compile unavailable (%s); compiling %s inline", exc, self.ks.name)

    def _kernel(self) -> Any:
        if self.fn is None:
            with counters.phase("triton.compile"):
                self.fn = self._load()
        return self.fn

    def _load(self) -> Any:
        """The kernel function, once the compile workers are done with it."""
        for future in self.warming:
            try:
                future.result()
            except Exception as exc:  # compile again here; errors surface from here
                log.info("parallel compile of %s failed (%s); compiling inline", self.ks.name, exc)
        self.warming = []
        return getattr(load_module(self.path), self.ks.name)

    def run(self, cfg: Config, tensors: Sequence[Any]) -> None:
        """Launch with ``cfg``: the binary directly once the JIT has compiled it.

        Triton's JIT re-binds and re-specialises every argument on each launch, which
        costs more host time than the launch itself; a graph of dozens of small kernels
        leaves the GPU waiting on Python. The specialisation that can change between calls of one
        graph is a pointer's 16-byte alignment (sizes and dtypes are static), so the
        compiled kernel is kept per config and alignment pattern and launched as is.
        """
        key = (cfg, *[t.data_ptr() % 16 == 0 for t in tensors])
        found = self._binaries.get(key)
        if found is not None:
            found(*tensors)
            return
        grid = cfg.grid(self.ks)
        kernel = self._kernel()
        with counters.phase("triton.compile"):  # the JIT builds it, or loads what workers built
            compiled = kernel[grid](
                *tensors, *self.scalars, num_warps=cfg.num_warps, **cfg.constexprs(self.ks.kind)
            )
        if not INTERPRET and compiled is not None:  # the interpreter compiles nothing
            trailing = (*self.scalars, *cfg.constexprs(self.ks.kind).values())
            self._binaries[key] = _binary_launch(compiled, grid, tensors[0].device, trailing)

    def __call__(self, *args: torch.Tensor) -> None:
        tensors = args if self.positions is None else [args[i] for i in self.positions]
        aligned = tuple([t.data_ptr() % 16 == 0 for t in tensors])
        launch = self._tuned.get(aligned)
        if launch is not None:  # every call after the first: one lookup, one launch
            launch(*tensors)
            return
        if self.ks.numel == 0:
            return
        cfg = self.tuner.choose(self.run, tensors)
        self.run(cfg, tensors)
        found = self._binaries.get((cfg, *aligned))
        if found is not None:
            self._tuned[aligned] = found


def _tuned(tuner: Autotuner) -> tuple[str, Config] | None:
    """The tuned config with the device it was tuned on (None: not tuned yet)."""
    return None if tuner.best is None else (device_name(), tuner.best)


def _restored(
    kind: type[TritonLauncher],
    ks: KernelSource,
    arg_names: Sequence[str],
    written: Sequence[str],
    configs: Sequence[Config],
    options: dict[str, Any],
    tuned: tuple[str, Config] | None,
) -> TritonLauncher:
    """:meth:`TritonLauncher.__reduce__`'s launcher, in this process."""
    cache_dir = config.options.cache_dir
    path = write_module(cache_dir, ks.module_text, ks.name)
    launcher = kind(ks, path, arg_names, written, configs, cache_dir, **options)
    if tuned is not None and tuned[0] == device_name() and tuned[1] in launcher.tuner.configs:
        launcher.tuner.best = tuned[1]
    return launcher


def _binary_launch(
    compiled: Any, grid: Sequence[int], device: torch.device, trailing: Sequence[Any]
) -> Callable[..., None]:
    """A launch of Triton's compiled kernel through its driver launcher, as Triton's own
    ``compiled[grid](*args)`` does minus the per-launch lookups of the current device and
    stream (through ``torch.cuda``), of launch hooks and of their metadata: about half of a
    launch's host time. Launch hooks (a profiler such as proton) installed before the first
    launch are kept by launching the usual way."""
    gx, gy, gz = (*grid, 1, 1)[:3]
    runner = compiled[(gx, gy, gz)]
    if _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
        return lambda *tensors: runner(*tensors, *trailing)
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    raw_stream = torch._C._cuda_getCurrentRawStream
    index = device.index if device.index is not None else torch.cuda.current_device()

    def launch(*tensors: Any) -> None:
        run(gx, gy, gz, raw_stream(index), function, packed, None, None, None, *tensors, *trailing)

    return launch


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is installed: a function, or Triton's chain of them with any in it
    (newer Triton keeps an empty chain, which Triton's launcher would call on every launch)."""
    return hook is not None and bool(getattr(hook, "calls", True))
