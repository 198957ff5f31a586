"""What every test directory of the repository shares: the ``gpu`` marker, a whole-graph
cache folder of its own for each test, and the ``resident_bytes`` fixture for tests that
bound how much memory a run keeps.

A test that needs a CUDA device says so with ``@pytest.mark.gpu`` (or a module's
``pytestmark``) and nothing else: here the marker is registered, and its tests are
skipped where CUDA is absent, so a CPU machine runs the rest and ``pytest -m gpu``
on a GPU machine runs exactly these (``benchmarks/gpu_run.sh tests``).
"""

import contextlib
import ctypes
import os
from collections.abc import Callable

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


def _resident_bytes(trim: bool = True) -> int:
    """Resident bytes of this process (Linux), by default after glibc returns its free heap
    memory.

    glibc raises its mmap threshold after a large block is freed, so later blocks of that size
    come from the heap, whose free memory stays resident until trimmed: without the trim, RSS
    counts what the allocator keeps as well as what is leaked. A test that also times the code
    between two readings passes ``trim=False``: the heap given back is faulted in again by the
    next allocations, which slows whatever runs first after the reading.
    """
    if trim:
        with contextlib.suppress(OSError, AttributeError):  # not glibc
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(autouse=True)
def _own_graph_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Kiln's whole-graph cache is on by default and outlives processes: each test gets an
    empty one of its own (``KILN_GRAPH_CACHE_DIR``), so no test loads programs that another
    compiled and counts of compiles and kernels stay each test's own, while every compile
    still goes through the cache (a test compiling the same graph twice loads it)."""
    monkeypatch.setenv("KILN_GRAPH_CACHE_DIR", str(tmp_path_factory.mktemp("graphs")))


@pytest.fixture
def resident_bytes() -> Callable[..., int]:
    """A function that reads this process's resident memory (see ``_resident_bytes``)."""
    return _resident_bytes
