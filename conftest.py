"""What every test directory of the repository shares: the ``gpu`` marker.

A test that needs a CUDA device says so with ``@pytest.mark.gpu`` (or a module's
``pytestmark``) and nothing else: here the marker is registered, and its tests are
skipped where CUDA is absent, so a CPU machine runs the rest and ``pytest -m gpu``
on a GPU machine runs exactly these (``benchmarks/gpu_run.sh tests``).
"""

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
