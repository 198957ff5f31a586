"""Kernels run under Triton's interpreter on CPU tensors (no GPU needed).

``TRITON_INTERPRET`` must be set before triton is imported (``pytest_configure``
runs before any test module here is imported). Tests pass ``backend=`` or
register the Triton backend for device ``cpu`` so loopir sends CPU kernels to
it. A ``-m gpu`` run on a CUDA machine uses the real compiler instead.
"""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# never read or fill a developer's cache: every session starts from an empty one
_CACHE = tempfile.mkdtemp(prefix="kiln-triton-test-")
os.environ["KILN_TRITON_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402


def _gpu_run(config) -> bool:
    return config.getoption("markexpr", "").strip() == "gpu" and torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _gpu_run(config):
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    if not _gpu_run(config):
        os.environ["TRITON_INTERPRET"] = "1"
    # masked-off lanes of the interpreter divide by the zeros masked loads return
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
