"""A compile worker: ``python -m kiln.codegen_triton.compile_worker``.

Runs in its own interpreter (never a fork or a multiprocessing child, which
would re-run the user's unguarded ``__main__``). Reads one JSON job per line on
stdin, warms Triton's on-disk cache for every config of that kernel, and answers
one line ``KILN-DONE {"ok": ...}`` on stdout.
"""

from __future__ import annotations

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
    configs: Sequence[tuple[dict[str, int], int]],
) -> None:  # fmt: skip
    """Compile kernel ``name`` of module ``path`` for every config (no launch)."""
    fn = getattr(load_module(Path(path)), name)
    tensors = [torch.empty(16, dtype=getattr(torch, d), device="cuda") for d in dtypes]
    for constexprs, warps in configs:
        fn.warmup(*tensors, *scalars, grid=(1,), num_warps=warps, **constexprs)


def _answer(reply: dict[str, Any]) -> None:
    sys.stdout.write(REPLY_PREFIX + json.dumps(reply) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        try:
            job = json.loads(line)
            warm(job["path"], job["name"], job["dtypes"], job["scalars"], job["configs"])
        except Exception as exc:  # reported to the parent, which compiles inline instead
            _answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        else:
            _answer({"ok": True})


if __name__ == "__main__":
    main()
