"""A compile worker: this module run by ``compile_pool.worker_command()`` (or ``python -m``).

Runs in its own interpreter (never a fork or a multiprocessing child, which
would re-run the user's unguarded ``__main__``). Reads one JSON job per line on
stdin, warms Triton's on-disk cache for every config of that kernel, and answers
one line ``KILN-DONE {"ok": ...}`` on stdout.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kiln.codegen_triton.compile_pool import REPLY_PREFIX
from kiln.codegen_triton.module_cache import load_module

__all__ = ["warm", "main"]


def warm(
    path: str, name: str, dtypes: Sequence[str], scalars: Sequence[int],
    configs: Sequence[tuple[dict[str, int], int]], load: bool = True,
) -> None:  # fmt: skip
    """Compile kernel ``name`` of module ``path`` for every config (no launch); ``load``: load
    the first as well (see :func:`_load`; the configs of a kernel share one launcher)."""
    fn = getattr(load_module(Path(path)), name)
    tensors = [torch.empty(16, dtype=getattr(torch, d), device="cuda") for d in dtypes]
    for i, (constexprs, warps) in enumerate(configs):
        compiled = fn.warmup(*tensors, *scalars, grid=(1,), num_warps=warps, **constexprs)
        if load and i == 0:
            _load(compiled)


def _load(compiled: Any) -> None:
    """Load the compiled kernel here, as the parent will, so Triton builds its launcher now.

    Triton up to 3.6 builds a C launcher for each kernel signature when a kernel of that
    signature first loads, with the host's C compiler: 0.1 to 0.2 s each, which a graph of
    dozens of kernels would otherwise pay one after another on the calling thread. The built
    launcher goes to Triton's disk cache, where the parent's load finds it. A kernel that
    fails to load here fails there too, where the error is handled (the autotuner drops it).
    """
    init = getattr(compiled, "_init_handles", None)
    if init is None:
        return
    with contextlib.suppress(Exception):  # the parent's load raises it again, and handles it
        init()


def _answer(reply: dict[str, Any]) -> None:
    sys.stdout.write(REPLY_PREFIX + json.dumps(reply) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        try:
            job = json.loads(line)
            warm(
                job["path"], job["name"], job["dtypes"], job["scalars"], job["configs"],
                job.get("load", True),
            )  # fmt: skip
        except Exception as exc:  # reported to the parent, which compiles inline instead
            _answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        else:
            _answer({"ok": True})


if __name__ == "__main__":
    main()
