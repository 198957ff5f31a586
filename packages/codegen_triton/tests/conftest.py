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
    # the root conftest skips gpu tests where CUDA is absent; where it is present, a run
    # without -m gpu still uses the interpreter, which cannot launch on a CUDA device
    if _gpu_run(config) or not torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="runs under Triton's interpreter: GPU tests need -m gpu")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_configure(config):
    if not _gpu_run(config):
        os.environ["TRITON_INTERPRET"] = "1"
    # masked-off lanes of the interpreter divide by the zeros masked loads return
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
