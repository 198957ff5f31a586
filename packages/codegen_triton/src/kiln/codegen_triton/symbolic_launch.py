"""Launching a kernel over symbolic sizes: sizes, grid and config per call.

loopir's wrapper calls ``launcher(*tensors, *sizes)`` with this call's value of each size
symbol the kernel names (:class:`~kiln.codegen_triton.symbolic_sizes.SymbolicSizes`). The
launcher computes ``xnumel``, ``rnumel`` and the kernel's size arguments with one generated
function, and the grid from ``xnumel`` and the config's ``XBLOCK``.

Configs are tuned per *size bucket*: the powers of two at or above ``xnumel`` and ``rnumel``.
A bucket has its own :class:`~kiln.codegen_triton.autotune.Autotuner` (candidates from the
bucket's sizes, the winner cached on disk under the kernel source and the bucket), so a new
size in a bucket seen before launches at once, without benchmarking or compiling again. A new
``xnumel`` bucket within :data:`REUSE_SPAN` of a tuned one (same ``rnumel`` bucket) takes that
bucket's tuner: ``XBLOCK`` only sizes the grid, so its winner is valid and near its best there,
and a sequence length growing from 17 to 128 does not re-tune every kernel at each doubling.

Triton specialises a compiled kernel on each integer argument being 1 or a multiple of 16
(and on its width), as it does on the 16-byte alignment of pointers, so a compiled binary is
kept per config and pattern of those facts and launched directly, as the static launcher does.
The sizes the graph was compiled at get binaries specialised to them (the compile workers
build them). Other patterns share one *generic* binary per config and pointer alignment,
compiled with no size specialised (every size a plain 32-bit argument, valid for any value
below 2**31): once a config wins its bucket, the compile workers build its generic binary in
the background, so a later size with another pattern loads it instead of compiling every
kernel of the graph in turn on the calling thread. The launch for an exact set of sizes (and
alignments) is kept too (:data:`LAUNCHES_KEPT`): a steady-state call is one generated
function, one lookup and the launch.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from triton import knobs

from kiln.capture import counters
from kiln.codegen_triton.autotune import Autotuner, Config, candidate_configs
from kiln.codegen_triton.compile_pool import compile_pool
from kiln.codegen_triton.errors import TritonLaunchError
from kiln.codegen_triton.kernel import INT32_LIMIT, KernelSource
from kiln.codegen_triton.mathlib import INTERPRET
from kiln.codegen_triton.runtime import TritonLauncher, _hooked
from kiln.codegen_triton.symbolic_sizes import SymbolicSizes, bucket

__all__ = ["LAUNCHES_KEPT", "REUSE_SPAN", "SymbolicLauncher"]

LAUNCHES_KEPT = 256
"""Exact size sets whose launch a launcher keeps ready (all are dropped when it fills)."""

REUSE_SPAN = 4
"""How many times larger or smaller a new ``xnumel`` bucket may be than a tuned one and still
take its tuner (with the same ``rnumel`` bucket)."""

_GENERIC_SIZE = 17
"""A size that Triton specialises on nothing (not 1, no multiple of 16, 32 bits)."""

_Launch = Callable[[Sequence[Any]], None]

log = logging.getLogger(__name__)


class SymbolicLauncher(TritonLauncher):
    """:class:`~kiln.codegen_triton.runtime.TritonLauncher` for a kernel over symbolic sizes."""

    def __init__(
        self,
        ks: KernelSource,
        path: Path,
        arg_names: Sequence[str],
        written: Sequence[str],
        configs: Sequence[Config],
        cache_dir: Path,
        *,
        max_autotune: bool = False,
    ) -> None:
        super().__init__(ks, path, arg_names, written, configs, cache_dir)
        assert ks.symbolic is not None, "a symbolic launcher needs a kernel over symbolic sizes"
        self.symbolic: SymbolicSizes = ks.symbolic
        self.count = len(arg_names)
        self.scalars = [*ks.sizes, *self.symbolic.param_hints()]  # what compile workers warm
        self.max_autotune = max_autotune
        self.cache_dir = cache_dir
        self.written_pos = [i for i, n in enumerate(dict.fromkeys(arg_names)) if n in set(written)]
        self._sizes = self.symbolic.evaluator()
        self._tuners: dict[tuple[int, int], Autotuner] = {}
        self._tuned_at: dict[tuple[int, int], Autotuner] = {}
        """The tuners made for their own bucket (``_tuners`` also maps buckets that share one)."""
        self._compiled: dict[tuple[Any, ...], Any] = {}
        self._ready: dict[tuple[Any, ...], _Launch] = {}
        self._warm_job: dict[str, Any] | None = None
        self._generic_ok: dict[Config, concurrent.futures.Future[None] | None] = {}
        """The configs that launch other sizes' patterns with their generic binary, and the
        compile workers' job building it (None: none, it compiles here)."""

    # stored as the base class stores it: the constructor rebuilds the rest (the tuners per
    # bucket are found again in the autotuning cache)
    __reduce__ = TritonLauncher.__reduce__

    def _options(self) -> dict[str, Any]:
        return {"max_autotune": self.max_autotune}

    def start_parallel_compile(self, dtypes: Sequence[torch.dtype], workers: int) -> None:
        super().start_parallel_compile(dtypes, workers)
        names = [str(d).removeprefix("torch.") for d in dtypes]
        self._warm_job = {"path": str(self.path), "name": self.ks.name, "dtypes": names}
        self._workers = workers

    def tuner_for(self, xnumel: int, rnumel: int) -> Autotuner:
        """The autotuner of the size bucket of ``xnumel`` x ``rnumel`` (or of a tuned bucket
        near it: see the module docstring)."""
        key = (bucket(xnumel), bucket(rnumel))
        found = self._tuners.get(key)
        if found is None:
            near = [
                (max(k[0], key[0]) // min(k[0], key[0]), k)
                for k, tuner in self._tuned_at.items()
                if k[1] == key[1] and tuner.best is not None
            ]
            if near and min(near)[0] <= REUSE_SPAN:
                found = self._tuners[key] = self._tuned_at[min(near)[1]]
                return found
            at = dataclasses.replace(self.ks, numel=key[0], rnumel=key[1])
            configs = candidate_configs(at, max_autotune=self.max_autotune)
            ident = f"{self.ks.source}\n# sizes {key[0]} {key[1]}"
            found = Autotuner(ident, configs, self.cache_dir, self.written_pos)
            self._tuners[key] = self._tuned_at[key] = found
        return found

    def __call__(self, *args: Any) -> None:
        count = self.count
        tensors = args[:count] if self.positions is None else [args[i] for i in self.positions]
        # the sizes loopir passes decide every size the launch uses: they key it as they are
        key = (*args[count:], *[t.data_ptr() % 16 == 0 for t in tensors])
        launch = self._ready.get(key)
        if launch is not None:  # every call at sizes seen before: one lookup, one launch
            launch(tensors)
            return
        launch = self._prepare(args[count:], tensors)
        if launch is not None:
            if len(self._ready) >= LAUNCHES_KEPT:
                self._ready.clear()
            self._ready[key] = launch

    def _prepare(self, sizes: Sequence[int], tensors: Sequence[Any]) -> _Launch | None:
        """Launch at new sizes (tuning their bucket if new); the launch for the next time."""
        values = self._sizes(*sizes)
        xnumel, rnumel, extent = values[:3]
        if extent > INT32_LIMIT:
            msg = (
                f"{self.ks.name} indexes with 32 bits, compiled for sizes below 2**31, and this "
                f"call reaches {extent} elements; compile with static shapes for such sizes"
            )
            raise TritonLaunchError(msg)
        if xnumel == 0:
            return None
        scalars = (xnumel, rnumel, *values[3:]) if self.ks.reduction else (xnumel, *values[3:])
        tuner = self.tuner_for(xnumel, rnumel)
        cfg = tuner.choose(lambda c, ts: self.launch_with(c, ts, scalars)(ts), tensors)
        self.launch_with(cfg, tensors, scalars)(tensors)
        self._warm_generic(cfg, len(scalars))
        return self.launch_with(cfg, tensors, scalars)  # the binary, now that it is built

    def _warm_generic(self, cfg: Config, count: int) -> None:
        """From now on ``cfg`` launches other patterns of sizes with its generic binary; the
        compile workers (when on) start building it into Triton's disk cache."""
        if cfg in self._generic_ok or INTERPRET:
            return
        job = None
        if self._warm_job is not None:
            warm = self._warm_job | {
                "scalars": [_GENERIC_SIZE] * count,
                "configs": [(cfg.constexprs(self.ks.kind), cfg.num_warps)],
            }
            try:
                job = compile_pool(self._workers).submit(warm)
            except RuntimeError:  # a broken pool: it compiles here when first needed
                job = None
        self._generic_ok[cfg] = job

    def _generic(self, cfg: Config, tensors: Sequence[Any], count: int) -> Any:
        """``cfg``'s binary that specialises no size, for these pointers' alignment."""
        spec = (cfg, *[t.data_ptr() % 16 == 0 for t in tensors], "generic")
        found = self._compiled.get(spec)
        if found is None:
            kernel = self._kernel()
            with counters.phase("triton.compile"):
                found = self._compiled[spec] = self._build_generic(kernel, cfg, tensors, count)
        return found

    def _build_generic(self, kernel: Any, cfg: Config, tensors: Sequence[Any], count: int) -> Any:
        """The generic binary: loaded from what a compile worker built, else compiled here."""
        job = self._generic_ok.get(cfg)
        if job is not None:
            try:
                job.result()  # built there: the warmup below loads it from disk
            except Exception as exc:
                log.info("generic compile of %s failed there (%s)", self.ks.name, exc)
        generic = [_GENERIC_SIZE] * count
        constexprs = cfg.constexprs(self.ks.kind)
        return kernel.warmup(*tensors, *generic, grid=(1,), num_warps=cfg.num_warps, **constexprs)

    def launch_with(self, cfg: Config, tensors: Sequence[Any], scalars: Sequence[int]) -> _Launch:
        """The launch of ``cfg`` at these sizes: the compiled binary once the JIT built it."""
        grid = (-(-scalars[0] // cfg.XBLOCK),)
        constexprs = cfg.constexprs(self.ks.kind)
        trailing = (*scalars, *constexprs.values())
        spec = (
            cfg,
            *[t.data_ptr() % 16 == 0 for t in tensors],
            *[(v == 1, v % 16 == 0, v > INT32_LIMIT) for v in scalars],
        )
        compiled = self._compiled.get(spec)
        if compiled is None and cfg in self._generic_ok and max(scalars) <= INT32_LIMIT:
            compiled = self._generic(cfg, tensors, len(scalars))
        if compiled is not None:
            return _binary(compiled, grid[0], tensors[0].device, trailing)
        kernel = self._kernel()

        def first(ts: Sequence[Any]) -> None:
            with counters.phase("triton.compile"):  # built by the JIT, or by the workers
                done = kernel[grid](*ts, *scalars, num_warps=cfg.num_warps, **constexprs)
            if not INTERPRET and done is not None:  # the interpreter compiles nothing
                self._compiled[spec] = done

        return first


def _binary(compiled: Any, gx: int, device: torch.device, trailing: Sequence[Any]) -> _Launch:
    """A launch of Triton's compiled kernel through its driver launcher (see
    :func:`kiln.codegen_triton.runtime._binary_launch`), at one grid and set of sizes."""
    if _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
        runner = compiled[(gx, 1, 1)]
        return lambda tensors: runner(*tensors, *trailing)
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    raw_stream = torch._C._cuda_getCurrentRawStream
    index = device.index if device.index is not None else torch.cuda.current_device()

    def launch(tensors: Sequence[Any]) -> None:
        run(gx, 1, 1, raw_stream(index), function, packed, None, None, None, *tensors, *trailing)

    return launch
