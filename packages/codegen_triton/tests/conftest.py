"""Kernels run under Triton's interpreter on CPU tensors (no GPU needed).

``TRITON_INTERPRET`` must be set before triton is imported anywhere; the Triton
backend is registered for device ``cpu`` so loopir's pipeline sends CPU kernels
to it. GPU tests (``-m gpu``) run with the real compiler instead.
"""

import os
import sys
import tempfile
from pathlib import Path

import pytest

_GPU_RUN = "gpu" in " ".join(sys.argv) and "not gpu" not in " ".join(sys.argv)
if not _GPU_RUN:
    os.environ["TRITON_INTERPRET"] = "1"
# never read or fill a developer's cache: every session starts from an empty one
os.environ["KILN_TRITON_CACHE"] = tempfile.mkdtemp(prefix="kiln-triton-test-")
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and _GPU_RUN:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    # masked-off lanes of the interpreter divide by the zeros masked loads return
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
