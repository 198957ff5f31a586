"""A worker process: checks a list of ops in order, one JSON line per event in a results file.

``python -m opinfo.worker MODE SAMPLES SEED RESULTS OP...``. Before each op it writes
``{"start": op}`` and after it the op's result, flushed at once, so the parent knows which op a
crash or hang happened in and can start a fresh worker on the ops after it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "ops_by_key"]


def ops_by_key() -> dict[str, Any]:
    """Every OpInfo of PyTorch's database by the sweep's name for it."""
    from torch.testing._internal.common_methods_invocations import op_db

    from opinfo.check import op_key

    return {op_key(op): op for op in op_db}


def main(argv: Sequence[str]) -> int:
    mode, samples, seed, out_path, *names = argv
    # One thread per worker: the parent runs workers side by side.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    from opinfo.check import check_op

    ops = ops_by_key()
    with open(out_path, "a", encoding="utf-8") as out:
        for name in names:
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            result = check_op(ops[name], mode, samples=int(samples), seed=int(seed))
            out.write(json.dumps(dataclasses.asdict(result)) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
