"""DDP and FSDP2 training of a small transformer in two processes (gloo on CPU), against eager.

Each group is one spawned run of ``distributed_ranks.py`` (two ranks, five steps per
scenario): DDP compiled both ways (``kiln.compile(DDP(m))``, ``DDP(kiln.compile(m))``) with
its graph split at the gradient buckets (pieces counted per ``bucket_cap_mb``: a one-byte
bucket, about a block, one bucket for all), ``find_unused_parameters``, ``static_graph`` and
``no_sync``, plus a traced all_reduce; FSDP2 per block and root under a bfloat16
``MixedPrecisionPolicy``, compiled per block and whole.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")

SCRIPT = Path(__file__).with_name("distributed_ranks.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("group", ["ddp", "fsdp2"])
def test_two_ranks_train_as_eager(group: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-W", "ignore::UserWarning", str(SCRIPT), group, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert f"{group}: two ranks ok" in done.stdout
