"""Capture runs torch's Python meta kernels and its own dispatch modes, which torch wraps in
``torch._disable_dynamo``: a capture must not import TorchDynamo to run them, and once
someone else imports it, the wrappers must be torch's own again."""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import sys, torch
from kiln.capture import dynamo_free
from kiln.capture.meta import FakeMode

x = torch.randn(4, 8)
with FakeMode():  # layer_norm's meta kernel is a Python reference behind _disable_dynamo
    y = torch.nn.functional.layer_norm(x, (8,)).rsqrt()
assert tuple(y.shape) == (4, 8)
assert "torch._dynamo" not in sys.modules, "a fake-tensor op imported torch._dynamo"

import torch._dynamo  # now Dynamo may trace: each wrapper becomes torch's disabled function
with FakeMode():
    torch.nn.functional.layer_norm(x, (8,))
inner = FakeMode.__dict__["__torch_dispatch__"]
cells = dict(zip(inner.__code__.co_freevars, inner.__closure__))
attached = getattr(cells["fn"].cell_contents, "__dynamo_disable")
assert not isinstance(attached, dynamo_free._DisabledOnceImported), attached
print("ok")
"""


def test_fakes_run_torch_kernels_without_importing_dynamo() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
